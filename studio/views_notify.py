"""The project's notification channels page: every member who can read the project sees
the channels; admins add, enable or disable, delete, test them, rotate a webhook's secret
(shown once) and see the last deliveries. The page and the API call the same functions
(studio.notify)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from studio import notify
from studio.access import check_role, get_project_for_user, role_allows, signed_in
from studio.api import MAX_ID
from studio.forms import ActionFormMixin
from studio.models import Delivery, NotificationChannel, Project
from studio.views import page

RECENT_DELIVERIES = 20
# A new or rotated webhook secret waits here for the one page view after the redirect that
# shows it (Post/Redirect/Get): a reload neither re-posts the form nor shows the secret again.
SESSION_NEW_SECRET_KEY = "notify_new_secret"


class ChannelForm(ActionFormMixin, forms.Form):
    name = forms.CharField(max_length=100, help_text="Unique in the project, e.g. 'on-call' or 'team mail'.")
    kind = forms.ChoiceField(choices=[("webhook", "Webhook (signed JSON POST)"), ("email", "E-mail")])
    url = forms.CharField(max_length=2000, required=False, label="Webhook URL",
                          widget=forms.URLInput(attrs={"placeholder": "https://hooks.example.com/trainyard"}))
    emails = forms.CharField(max_length=5000, required=False, label="E-mail addresses",
                             widget=forms.Textarea(attrs={"rows": 2, "placeholder": "ops@example.com, me@example.com"}),
                             help_text="Separated by commas or new lines.")

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("This field is required.")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            raise forms.ValidationError("Names cannot contain control characters.")
        return name

    # The page shows only the chosen kind's field (data-shown-for): the other's text, hidden
    # and perhaps left from before the kind changed, is dropped rather than checked.
    def clean_url(self) -> str:
        if self.cleaned_data.get("kind") != "webhook":
            return ""
        url = self.cleaned_data["url"].strip()
        if url and (problem := notify.webhook_url_problem(url)):
            raise forms.ValidationError(problem)
        return url

    def clean_emails(self) -> list[str]:
        if self.cleaned_data.get("kind") != "email":
            return []
        addresses: list[str] = []
        for address in self.cleaned_data["emails"].replace(",", "\n").split():
            if problem := notify.email_problem(address):
                raise forms.ValidationError(problem)
            if address not in addresses:
                addresses.append(address)
        if len(addresses) > notify.MAX_EMAILS:
            raise forms.ValidationError(f"At most {notify.MAX_EMAILS} addresses.")
        return addresses

    def clean(self) -> dict:
        data = super().clean() or {}
        if data.get("kind") == "webhook" and "url" in data and not data["url"]:
            self.add_error("url", "A webhook needs a URL.")
        if data.get("kind") == "email" and "emails" in data and not data["emails"]:
            self.add_error("emails", "An e-mail channel needs at least one address.")
        return data


def _show_secret_once(request: HttpRequest, channel: NotificationChannel, secret: str) -> HttpResponse:
    if secret:  # an e-mail channel has none
        request.session[SESSION_NEW_SECRET_KEY] = {"project": channel.project_id, "channel": channel.pk, "secret": secret}
    return redirect("notification-channels", slug=channel.project.slug)


def _render(request: HttpRequest, project: Project, form: ChannelForm | None, *, status: int = 200) -> HttpResponse:
    admin = role_allows(project.role_of(request.user), admin=True)
    channels = list(NotificationChannel.objects.filter(project=project).order_by("name"))
    new_secret, secret_for = "", None
    pending = request.session.get(SESSION_NEW_SECRET_KEY)
    # Taken from the session only on its own project's page, by an admin: it is shown once.
    if admin and isinstance(pending, dict) and pending.get("project") == project.pk:
        del request.session[SESSION_NEW_SECRET_KEY]
        secret_for = next((c for c in channels if c.pk == pending.get("channel")), None)
        new_secret = str(pending.get("secret") or "") if secret_for is not None else ""
    deliveries = (Delivery.objects.filter(channel__project=project).select_related("channel")
                  .order_by("-created_at", "-pk")[:RECENT_DELIVERIES]) if admin else []
    return render(request, "studio/notification_channels.html", {
        "project": project, "is_admin": admin, "channels": channels, "deliveries": deliveries,
        "form": form if admin else None, "new_secret": new_secret, "secret_for": secret_for,
        "new_standard_secret": notify.standard_webhooks_secret(new_secret) if new_secret else "",
    }, status=status)


@page
def channel_list(request: HttpRequest, slug: str) -> HttpResponse:
    project = get_project_for_user(request.user, slug)
    if request.method != "POST":
        return _render(request, project, ChannelForm())
    check_role(request.user, project, admin=True)
    form = ChannelForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        created = form.run_action(lambda: notify.create_channel(
            project=project, user=signed_in(request.user), name=data["name"], kind=data["kind"], url=data["url"],
            emails=data["emails"]))
        if created is not None:
            channel, secret = created
            messages.success(request, f"Channel “{channel.name}” added.")
            return _show_secret_once(request, channel, secret)
    return _render(request, project, form, status=400)


def _admin_channel(request: HttpRequest, slug: str, pk: int) -> NotificationChannel:
    project = get_project_for_user(request.user, slug, admin=True)
    channel = NotificationChannel.objects.filter(project=project, pk=pk).first() if pk <= MAX_ID else None
    if channel is None:
        raise Http404("No such notification channel.")
    return channel


@page
@require_POST
def channel_toggle(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    channel = _admin_channel(request, slug, pk)
    notify.update_channel(channel, {"enabled": not channel.enabled})
    messages.success(request, f"Channel “{channel.name}” {'enabled' if channel.enabled else 'disabled'}.")
    return redirect("notification-channels", slug=slug)


@page
@require_POST
def channel_delete(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    channel = _admin_channel(request, slug, pk)
    notify.delete_channel(channel)
    messages.success(request, f"Channel “{channel.name}” deleted.")
    return redirect("notification-channels", slug=slug)


@page
@require_POST
def channel_test(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    channel = _admin_channel(request, slug, pk)
    delivery = notify.send_test(channel, signed_in(request.user))
    disabled = "" if channel.enabled else " (the channel is disabled: this test goes to it, alarms do not until you enable it)"
    messages.success(request, f"Test delivery {delivery.pk} to “{channel.name}” queued{disabled}; its outcome appears below.")
    return redirect("notification-channels", slug=slug)


@page
@require_POST
def channel_rotate(request: HttpRequest, slug: str, pk: int) -> HttpResponse:
    channel = _admin_channel(request, slug, pk)
    if channel.kind != NotificationChannel.Kind.WEBHOOK:
        messages.error(request, "An e-mail channel has no signing secret.")
        return redirect("notification-channels", slug=slug)
    secret = notify.rotate_secret(channel)
    return _show_secret_once(request, channel, secret)
