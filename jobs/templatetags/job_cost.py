"""The cost blocks of the job and tuning job pages (jobs.cost), so those pages show cost
without their views computing it: `{% job_cost_panel job %}`, `{% tuning_cost_panel tuning %}`
and the filters `cost_duration` (seconds in words) and `price`."""

from __future__ import annotations

from decimal import InvalidOperation
from typing import Any

from django import template
from django.utils import timezone

from jobs import cost
from jobs.models import JobStatus

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
    figures = cost.job_cost(job, now=timezone.now())
    projected = figures["projected_cost"]
    return {"job": job, "figures": figures, "finished": job.is_finished(), "accrual": _accrual(job, figures),
            "projected_display": str(cost.to_cents(cost.Decimal(projected))) if projected is not None else None}


def _accrual(job, figures: dict[str, Any]) -> dict[str, Any] | None:
    """How the running attempt's figures grow per second from these, for job_detail.js to
    count on between the page's reads: the live regions are re-read only when the status
    changes, so a Training job's cost stood still for as long as it trained. From the figures
    already computed, so no query of its own."""
    if job.is_finished():
        return None
    running = [a for a in figures["attempts"] if a["running"]]
    if not running:
        return None
    current = running[-1]
    price = cost.Decimal(current["price_per_hour"] or 0)
    return {
        "attempt": current["attempt"],
        "nodes": current["nodes"],
        "cost_per_second": str(price * current["nodes"] / 3600),
        # Training time counts only while the job trains (Starting is billable, not training).
        "training_nodes": current["nodes"] if job.status == JobStatus.TRAINING and job.training_started_at else 0,
    }


@register.inclusion_tag("jobs/_tuning_cost.html")
def tuning_cost_panel(tuning_job) -> dict[str, Any]:
    return {"tuning": tuning_job, "figures": cost.tuning_cost(tuning_job)}
