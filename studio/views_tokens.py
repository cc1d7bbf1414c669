"""The API tokens page: create (shown once), list without secrets, revoke."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from studio import actions
from studio.access import signed_in
from studio.models import ApiToken
from studio.views import page

EXPIRY_CHOICES = [("", "Never"), ("7", "In 7 days"), ("30", "In 30 days"), ("90", "In 90 days"), ("365", "In a year")]


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where the token is used, e.g. 'CI' or 'laptop notebook'.")
    expires_in_days = forms.ChoiceField(choices=EXPIRY_CHOICES, required=False, label="Expires")


@page(reviewers=True)
def token_list(request: HttpRequest) -> HttpResponse:
    user = signed_in(request.user)
    form = TokenForm(request.POST or None)
    new_token = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        expires_at = timezone.now() + timedelta(days=int(days)) if days else None
        token, new_token = actions.issue_token(user, name=form.cleaned_data["name"], expires_at=expires_at)
        form = TokenForm()
    tokens = ApiToken.objects.filter(user=user).order_by("-created_at")
    return render(request, "studio/tokens.html", {"form": form, "tokens": tokens, "new_token": new_token, "now": timezone.now()})


@page(reviewers=True)
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=signed_in(request.user))
    actions.revoke_token(token)
    messages.success(request, f"Token “{token.name}” revoked; requests using it are refused from now on.")
    return redirect("tokens")
