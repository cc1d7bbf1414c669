"""Per-flow review statistics: the backlog, completions per hour, how long
items take, each reviewer's throughput, agreement, and how often the model agreed with the
people (with a confusion matrix).

Everything is aggregated in SQL (GROUP BY and counts) except the medians: PostgreSQL
computes them with percentile_cont; SQLite, which has no ordered-set aggregates, gets them
from one ordered column read (the development database holds small flows)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.db import connection
from django.db.models import Aggregate, Avg, Count, DurationField, ExpressionWrapper, F, FloatField, Func, Min, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import TruncHour
from django.utils import timezone

from review.consolidation import NO_CONSENSUS
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus, TaskType

HOURS_SHOWN = 24


class Backlog(TypedDict):
    loops: int  # InProgress loops
    open_slots: int  # answers still wanted and not held by anyone
    held_slots: int  # claimed, lease running
    oldest_created_at: str | None


class ReviewerStats(TypedDict):
    worker_id: int
    worker: str
    answers: int
    answers_per_hour: float | None  # answers per hour of time spent on them
    median_seconds_spent: float | None


class Median(Aggregate):
    """percentile_cont(0.5) WITHIN GROUP (ORDER BY expr): PostgreSQL's median aggregate."""

    function = "percentile_cont"
    name = "Median"
    template = "%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def status_counts(flow: FlowDefinition) -> dict[str, int]:
    counts = dict(flow.human_loops.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    return {status: counts.get(status, 0) for status in LoopStatus.values}


def backlog(flow: FlowDefinition) -> Backlog:
    row = flow.human_loops.filter(status=LoopStatus.IN_PROGRESS).aggregate(
        loops=Count("id"), open_slots=Sum("open_slots"), held_slots=Sum("holds_count"),
        oldest=Min("created_at"))
    oldest = row["oldest"]
    return Backlog(loops=row["loops"], open_slots=row["open_slots"] or 0, held_slots=row["held_slots"] or 0,
                   oldest_created_at=oldest.isoformat() if oldest else None)


def completed_per_hour(flow: FlowDefinition, now: datetime | None = None) -> list[dict[str, Any]]:
    """Loops completed in each of the last 24 clock hours (UTC), oldest first, the current
    (partial) hour last; hours without a completion are zeros, so the chart's axis is even."""
    now = (now or timezone.now()).astimezone(UTC)
    current = now.replace(minute=0, second=0, microsecond=0)
    first = current - timedelta(hours=HOURS_SHOWN - 1)
    rows = (flow.human_loops.filter(status=LoopStatus.COMPLETED, completed_at__gte=first)
            .annotate(hour=TruncHour("completed_at", tzinfo=UTC)).values("hour").annotate(n=Count("id")).values_list("hour", "n"))
    by_hour = {hour: n for hour, n in rows}
    series = []
    for index in range(HOURS_SHOWN):
        hour = first + timedelta(hours=index)
        series.append({"hour": hour.isoformat(), "completed": by_hour.get(hour, 0)})
    return series


def median_seconds_to_complete(flow: FlowDefinition) -> float | None:
    """Median of created → completed over the flow's Completed loops."""
    completed = flow.human_loops.filter(status=LoopStatus.COMPLETED, completed_at__isnull=False)
    duration = ExpressionWrapper(F("completed_at") - F("created_at"), output_field=DurationField())
    if _postgres():
        seconds = Func(duration, function="EXTRACT", template="EXTRACT(EPOCH FROM %(expressions)s)",
                       output_field=FloatField())
        value = completed.aggregate(median=Median(seconds))["median"]
        return float(value) if value is not None else None
    pairs = completed.values_list("created_at", "completed_at")
    return _median([(done - created).total_seconds() for created, done in pairs if done is not None])


def reviewer_throughput(flow: FlowDefinition) -> list[ReviewerStats]:
    """Per reviewer: answers given in this flow, answers per hour of time spent answering
    (3600 · answers / total seconds spent; time spent runs from claim to answer) and the
    median seconds spent on one answer. Busiest reviewer first."""
    answered = Assignment.objects.filter(loop__flow_definition=flow, status=AssignmentStatus.ANSWERED)
    grouped = answered.values("worker_id", "worker__username").annotate(
        answers=Count("id"), seconds=Sum("time_spent_seconds"))
    if _postgres():
        grouped = grouped.annotate(median=Median(F("time_spent_seconds")))
        medians = {row["worker_id"]: row["median"] for row in grouped}
    else:
        spent: dict[int, list[float]] = defaultdict(list)
        for worker_id, seconds in answered.exclude(time_spent_seconds=None).values_list("worker_id", "time_spent_seconds"):
            if seconds is not None:
                spent[worker_id].append(seconds)
        medians = {worker_id: _median(values) for worker_id, values in spent.items()}
    rows: list[ReviewerStats] = []
    for row in grouped:
        seconds = row["seconds"] or 0.0
        median = medians.get(row["worker_id"])
        rows.append(ReviewerStats(
            worker_id=row["worker_id"], worker=row["worker__username"], answers=row["answers"],
            answers_per_hour=round(3600 * row["answers"] / seconds, 2) if seconds > 0 else None,
            median_seconds_spent=float(median) if median is not None else None))
    rows.sort(key=lambda r: (-r["answers"], r["worker"]))
    return rows


def agreement(flow: FlowDefinition) -> dict[str, Any]:
    """Mean agreement over Completed loops that recorded one, how many loops had each
    agreement value, and how many ended with no consensus."""
    completed = flow.human_loops.filter(status=LoopStatus.COMPLETED)
    measured = completed.exclude(agreement=None)
    mean = measured.aggregate(mean=Avg("agreement"))["mean"]
    counts: dict[float, int] = defaultdict(int)
    for value, n in measured.values("agreement").annotate(n=Count("id")).values_list("agreement", "n"):
        if value is None:
            continue
        counts[round(value, 4)] += n  # floats from different divisions (2/3 vs 4/6) land in one bucket
    return {
        "mean": round(mean, 4) if mean is not None else None,
        "loops": sum(counts.values()),
        "distribution": [{"agreement": value, "loops": counts[value]} for value in sorted(counts)],
        "no_consensus": completed.filter(consolidated_label=NO_CONSENSUS).count(),
    }


def _ordered_labels(seen: set[str], flow_labels: list[str]) -> list[str]:
    """The flow's labels in its order (the inbox's keys) that occur, then any others, sorted."""
    known = [label for label in flow_labels if label in seen]
    return known + sorted(seen - set(known))


def model_vs_human(flow: FlowDefinition) -> dict[str, Any]:
    """Completed loops that carry both a model label and a consolidated human label (no
    consensus is left out): how often they match, and the confusion matrix with one row per
    model label and one column per human label."""
    if flow.task_type != TaskType.CLASSIFICATION:
        return {"compared": 0, "matches": 0, "accuracy": None,
                "confusion": {"model_labels": [], "human_labels": [], "matrix": []}}
    compared = (
        flow.human_loops.filter(status=LoopStatus.COMPLETED).exclude(consolidated_label="")
        .exclude(consolidated_label=NO_CONSENSUS).filter(prediction__label__isnull=False)
        .annotate(model_label=KT("prediction__label"))
    )
    cells = [(str(model), human, n) for model, human, n in
             compared.values("model_label", "consolidated_label").annotate(n=Count("id"))
             .values_list("model_label", "consolidated_label", "n") if model not in (None, "")]
    total = sum(n for _, _, n in cells)
    matches = sum(n for model, human, n in cells if model == human)
    labels = [str(label) for label in flow.labels or []]
    model_labels = _ordered_labels({model for model, _, _ in cells}, labels)
    human_labels = _ordered_labels({human for _, human, _ in cells}, labels)
    matrix = [[0] * len(human_labels) for _ in model_labels]
    for model, human, n in cells:
        matrix[model_labels.index(model)][human_labels.index(human)] += n
    return {
        "compared": total,
        "matches": matches,
        "accuracy": round(matches / total, 4) if total else None,
        "confusion": {"model_labels": model_labels, "human_labels": human_labels, "matrix": matrix},
    }


DEFAULT_AUDIT_DELTA = 0.05


def closing_the_loop(flow: FlowDefinition) -> dict[str, Any]:
    """How the model did against the people on the flow's Completed loops with a consensus
    label and a model label, split by why each loop started:

    - "reviewed": sent because its confidence was below the threshold (activation_reason
      "confidence_below"): the model's accuracy where it was unsure;
    - "audit": the random sample of predictions the threshold would have auto-accepted
      ("sampled"): the only unbiased estimate of the auto-accepted error, with its one-sided
      Clopper–Pearson upper bound at δ = flow.calibration["delta"] (0.05 by default).

    `warning` is set when that bound passes the target error the flow's threshold was set
    for (flow.calibration["target_error"])."""
    from trainyard.evaluation import clopper_pearson_upper

    calibration = flow.calibration or {}
    delta = float(calibration.get("delta") or DEFAULT_AUDIT_DELTA)
    counts = {reason: {"compared": 0, "matches": 0} for reason in ("confidence_below", "sampled")}
    if flow.task_type == TaskType.CLASSIFICATION:
        compared = (flow.human_loops.filter(status=LoopStatus.COMPLETED, activation_reason__in=list(counts))
                    .exclude(consolidated_label__in=["", NO_CONSENSUS]).filter(prediction__label__isnull=False)
                    .annotate(model_label=KT("prediction__label")))
        for reason, model, human, n in (compared.values("activation_reason", "model_label", "consolidated_label")
                                        .annotate(n=Count("id"))
                                        .values_list("activation_reason", "model_label", "consolidated_label", "n")):
            if model in (None, ""):
                continue
            counts[reason]["compared"] += n
            counts[reason]["matches"] += n if str(model) == human else 0

    def part(reason: str) -> dict[str, Any]:
        compared, matches = counts[reason]["compared"], counts[reason]["matches"]
        return {"compared": compared, "matches": matches, "errors": compared - matches,
                "accuracy": round(matches / compared, 4) if compared else None}

    audit = part("sampled")
    audit["error_rate"] = round(audit["errors"] / audit["compared"], 4) if audit["compared"] else None
    audit["upper"] = clopper_pearson_upper(audit["errors"], audit["compared"], delta) if audit["compared"] else None
    audit["delta"] = delta
    target = calibration.get("target_error")
    warning = None
    if target is not None and audit["upper"] is not None and audit["upper"] > float(target):
        warning = (f"The audit sample's upper bound on the auto-accepted error, {audit['upper']:.1%} (δ = {delta:g}, "
                   f"{audit['errors']} wrong of {audit['compared']}), is above the target {float(target):.1%} the "
                   "threshold was set for: "
                   + ("the sample is still too small to show the target holds; let the audit sample grow."
                      if audit["error_rate"] is not None and audit["error_rate"] <= float(target)
                      else "re-evaluate the model or raise the threshold so more items go to people."))
    return {"reviewed": part("confidence_below"), "audit": audit, "calibration": calibration or None,
            "target_error": target, "warning": warning}


def flow_stats(flow: FlowDefinition, now: datetime | None = None) -> dict[str, Any]:
    """Everything the flow page's stats panel and GET /api/v1/flow-definitions/<id>/stats/ show."""
    return {
        "flow_definition": {"id": flow.pk, "name": flow.name, "title": flow.title, "task_type": flow.task_type},
        "counts": status_counts(flow),
        "backlog": backlog(flow),
        "completed_per_hour": completed_per_hour(flow, now),
        "median_seconds_to_complete": median_seconds_to_complete(flow),
        "reviewers": reviewer_throughput(flow),
        "agreement": agreement(flow),
        "model_vs_human": model_vs_human(flow),
    }


def review_backlog(projects, limit: int = 6) -> dict[str, Any]:
    """The overview's review backlog over these projects: InProgress loops and the answers
    they still want, in total and for the flows with the most waiting (two queries)."""
    waiting = HumanLoop.objects.filter(project__in=projects, status=LoopStatus.IN_PROGRESS)
    totals = waiting.aggregate(loops=Count("id"), open_slots=Sum("open_slots"))
    in_progress = Q(human_loops__status=LoopStatus.IN_PROGRESS)
    flows = list(FlowDefinition.objects.filter(project__in=projects)
                 .annotate(backlog=Count("human_loops", filter=in_progress),
                           open_slots=Sum("human_loops__open_slots", filter=in_progress),
                           oldest=Min("human_loops__created_at", filter=in_progress))
                 .filter(backlog__gt=0).select_related("project").order_by("-backlog", "name")[:limit])
    return {"loops": totals["loops"], "open_slots": totals["open_slots"] or 0, "flows": flows}
