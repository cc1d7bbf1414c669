"""The cost blocks of the job and tuning job pages (jobs.cost), so those pages show cost
without their views computing it: `{% job_cost_panel job %}`, `{% tuning_cost_panel tuning %}`
and the filters `cost_duration` (seconds in words) and `price`."""

from __future__ import annotations

from decimal import InvalidOperation
from typing import Any

from django import template

from jobs import cost

register = template.Library()


@register.filter
def cost_duration(seconds: Any) -> str:
    try:
        return cost.duration_words(float(seconds or 0))
    except (TypeError, ValueError):
        return "—"


@register.filter
def price(value: Any) -> str:
    """A price as costs are shown: to the cent ("0.00", "1.50"), with the further decimals it
    has up to six ("0.125", "0.000417"); "—" for none."""
    if value is None or value == "":
        return "—"
    try:
        amount = cost.quantize(cost.Decimal(str(value)))
    except (InvalidOperation, ValueError):
        return str(value)
    cents = cost.to_cents(amount)
    return str(cents) if cents == amount else f"{amount.normalize():f}"


@register.inclusion_tag("jobs/_cost.html")
def job_cost_panel(job) -> dict[str, Any]:
    figures = cost.job_cost(job)
    projected = figures["projected_cost"]
    return {"job": job, "figures": figures, "finished": job.is_finished(),
            "projected_display": str(cost.to_cents(cost.Decimal(projected))) if projected is not None else None}


@register.inclusion_tag("jobs/_tuning_cost.html")
def tuning_cost_panel(tuning_job) -> dict[str, Any]:
    return {"tuning": tuning_job, "figures": cost.tuning_cost(tuning_job)}
