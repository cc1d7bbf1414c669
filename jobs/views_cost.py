"""Cost pages: a project's spend in a month (by instance type and by user, with a month
picker) and its instance prices, which project admins set or remove here. The pages and
the API (jobs.api_cost) call the same functions (jobs.cost)."""

from __future__ import annotations

import csv
import re

from django import forms
from django.contrib import messages
from django.db.models import Min
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from jobs import cost
from jobs.api_cost import INSTANCE_TYPE
from jobs.models import JobAttempt
from studio.access import check_role, get_project_for_user, role_allows, signed_in
from studio.models import Project
from studio.views import page


class PriceForm(forms.Form):
    instance_type = forms.CharField(max_length=64, help_text="As the nodes register it, e.g. cpu or gpu.")
    price_per_node_hour = forms.DecimalField(decimal_places=6, min_value=0, max_value=cost.MAX_PRICE,
                                             label="Per node-hour")
    price_per_gpu_hour = forms.DecimalField(decimal_places=6, min_value=0, max_value=cost.MAX_PRICE,
                                            required=False, label="Per GPU-hour", help_text="On top, per GPU of the node.")
    currency = forms.CharField(max_length=3, required=False, help_text="ISO 4217; the site's currency when left empty.")

    def clean_instance_type(self) -> str:
        value = self.cleaned_data["instance_type"].strip()
        if not INSTANCE_TYPE.match(value):
            raise forms.ValidationError("Letters, digits, '.', '_' or '-', starting with a letter or digit.")
        return value

    def clean_currency(self) -> str:
        value = (self.cleaned_data.get("currency") or "").strip().upper() or cost.default_currency()
        problem = cost.currency_error(value)
        if problem:
            raise forms.ValidationError(problem)
        return value


MONTHS_LISTED = 120


def _months_around(project: Project, month: str) -> list[str]:
    """The month picker's choices, newest first: every month from the project's first launch
    (or its creation, if earlier) to now, at least the last 12 and at most the last
    MONTHS_LISTED, and the chosen month wherever it is."""
    first = JobAttempt.objects.filter(job__project=project).aggregate(first=Min("started_at"))["first"]
    oldest = cost.current_month(min(filter(None, [first, project.created_at])))
    now = cost.current_month()
    year, number = int(now[:4]), int(now[5:])
    months: list[str] = []
    while len(months) < MONTHS_LISTED:
        months.append(f"{year:04d}-{number:02d}")
        if months[-1] <= oldest and len(months) >= 12:
            break
        year, number = (year - 1, 12) if number == 1 else (year, number - 1)
    if month not in months:
        months.append(month)
    return sorted(months, reverse=True)


@page
def project_spend_page(request: HttpRequest, slug: str) -> HttpResponse:
    project = get_project_for_user(request.user, slug)
    month = (request.GET.get("month") or "").strip() or cost.current_month()
    error = ""
    if not re.fullmatch(r"\d{4}-\d{2}", month):
        error = "Use YYYY-MM, e.g. 2026-12."
    else:
        try:
            cost.month_bounds(month)
        except ValueError as exc:
            error = str(exc)
    if error:
        bad, month = month, cost.current_month()
        spend = cost.project_spend(project, month)
        return render(request, "jobs/spend.html", {"project": project, "spend": spend, "month": month, "bad_month": bad,
                                                   "month_error": error, "months": _months_around(project, month)}, status=400)
    spend = cost.project_spend(project, month)
    return render(request, "jobs/spend.html", {"project": project, "spend": spend, "month": month,
                                               "months": _months_around(project, month)})


def _cell(value: object) -> object:
    """A CSV cell a spreadsheet shows as text: user text starting = + - @ (a formula to
    Excel or LibreOffice) gets a leading apostrophe; numbers and times pass as they are."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


@page
def project_spend_csv(request: HttpRequest, slug: str) -> HttpResponse:
    """The month's launches as CSV (cost.month_launches): what finance reconciles."""
    project = get_project_for_user(request.user, slug)
    month = (request.GET.get("month") or "").strip() or cost.current_month()
    try:
        cost.month_bounds(month)
    except ValueError as exc:
        return HttpResponse(f"month: {exc}\n", status=400, content_type="text/plain; charset=utf-8")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="trainyard-{project.slug}-spend-{month}.csv"'
    writer = csv.writer(response)
    writer.writerow(cost.LAUNCH_COLUMNS)
    for launch in cost.month_launches(project, month):
        writer.writerow([_cell(launch[column].isoformat() if hasattr(launch[column], "isoformat") else
                               "" if launch[column] is None else launch[column]) for column in cost.LAUNCH_COLUMNS])
    return response


def _render_prices(request: HttpRequest, project: Project, form: PriceForm | None, status: int = 200) -> HttpResponse:
    admin = role_allows(project.role_of(request.user), admin=True)
    return render(request, "jobs/prices.html", {
        "project": project, "is_admin": admin, "prices": cost.effective_prices(project.pk),
        "form": form if admin else None, "currency": cost.default_currency(),
    }, status=status)


@page
def instance_prices_page(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: the prices in force. POST (admins): set a price (action "set", the default)
    or remove the project's own one (action "remove", instance_type)."""
    project = get_project_for_user(request.user, slug)
    if request.method != "POST":
        return _render_prices(request, project, PriceForm())
    check_role(request.user, project, admin=True)
    if request.POST.get("action") == "remove":
        kind = (request.POST.get("instance_type") or "").strip()
        if INSTANCE_TYPE.match(kind) and cost.remove_project_price(project=project, instance_type=kind):
            messages.success(request, f"The project's own price for {kind} is removed; the site's applies again.")
        else:
            messages.error(request, "The project has no price of its own for that instance type.")
        return redirect("instance-prices", slug=project.slug)
    form = PriceForm(request.POST)
    if not form.is_valid():
        return _render_prices(request, project, form, status=400)
    data = form.cleaned_data
    if (conflict := cost.currency_conflict(project, data["instance_type"], data["currency"])) is not None:
        form.add_error("currency", conflict)
        return _render_prices(request, project, form, status=400)
    cost.set_project_price(project=project, instance_type=data["instance_type"], node=data["price_per_node_hour"],
                           gpu=data.get("price_per_gpu_hour") or cost.ZERO, currency=data["currency"],
                           user=signed_in(request.user))
    messages.success(request, f"Price for {data['instance_type']} set. Jobs placed from now on use it; jobs already "
                              "placed keep the price they started with.")
    return redirect("instance-prices", slug=project.slug)
