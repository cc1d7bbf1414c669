"""`{% job_rules_panel job %}`: the job's rules with their states, and the events strip of
their transitions (the charts mark where an alarm fired from the same data)."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe

from jobs.models import AlarmTransition, JobRule, RuleState, TrainingJob
from jobs.rules.common import STATES
from jobs.rules.engine import RULE_TYPES
from studio.models import NotificationChannel

register = template.Library()

STRIP_LENGTH = 30
MARKS_PER_RULE = 5
# The form's hint per type: what to put in parameters (the rest take their defaults).
DEFAULTS_SHOWN = {
    "custom": '{"metric": "validation_loss", "statistic": "mean", "window": 5, "comparison": ">", "threshold": 2.0, '
              '"datapoints_to_alarm": 2, "evaluation_periods": 3}',
    "budget": '{"limit": 25.0, "projected": true}',
    "stalled": '{"threshold_seconds": 1800}',
    "loss_not_decreasing": '{"metric": "train_loss", "num_steps": 10, "diff_percent": 0.1}',
    "overfit": '{"train_metric": "train_loss", "validation_metric": "validation_loss", "ratio_threshold": 0.1}',
}
STATE_BADGES: dict[str, str] = {RuleState.OK: "green", RuleState.ALARM: "red", RuleState.INSUFFICIENT_DATA: "grey"}


def action_words(actions: list[dict]) -> str:
    words = []
    for action in actions or []:
        kind = action.get("type", "")
        if kind == "notify":
            to = f"notify {', '.join(action['channels'])}" if action.get("channels") else "notify all channels"
            words.append(f"{to} on {' or '.join(action['on'])}" if action.get("on") else f"{to} on every change")
        elif kind == "tag":
            words.append(f"tag {action['tag']} on ALARM" if action.get("tag") else "tag on ALARM")
        else:
            words.append(f"{kind} on ALARM")
    return ", ".join(words) or "state only"


def _metric_of(t: AlarmTransition) -> str | None:
    """The metric the transition is about (the charts mark it there; None: on every chart)."""
    values = t.values if isinstance(t.values, dict) else {}
    metric = values.get("metric") or (t.rule.parameters or {}).get("metric")
    return metric if isinstance(metric, str) else None


def _step_of(t: AlarmTransition) -> int | None:
    """Where the charts mark the transition: the step of the point that caused it, or for an
    alarm of the clock (stalled, budget, …) the last step the job had reported then."""
    if t.step is not None:
        return t.step
    reached = t.values.get("step_reached") if isinstance(t.values, dict) else None
    return reached if isinstance(reached, int) and not isinstance(reached, bool) else None


def form_key(pk: int) -> str:
    """The session key of a refused Add-a-rule form (jobs.views_rules keeps it, the panel shows
    it again once)."""
    return f"rule-add:{pk}"


@register.simple_tag(takes_context=True)
def job_rules_panel(context: template.Context, job: TrainingJob) -> SafeString:
    rules = list(JobRule.objects.filter(job=job).order_by("pk"))
    transitions = list(AlarmTransition.objects.filter(job=job).select_related("rule").order_by("-at", "-pk")[:STRIP_LENGTH])
    for t in transitions:
        t.step_reached = None if t.step is not None else _step_of(t)  # type: ignore[attr-defined]
    # The chart marks: each rule's newest MARKS_PER_RULE steps into ALARM, however many
    # transitions other rules made since (the strip's newest 30 lost a rule that stayed in
    # ALARM behind one that flapped).
    newest_first = Window(RowNumber(), partition_by=[F("rule_id")], order_by=[F("at").desc(), F("pk").desc()])
    marks: list[dict[str, Any]] = [
        {"rule": t.rule.name, "to": t.to_state, "from": t.from_state, "step": _step_of(t), "at": t.at.isoformat(),
         "reason": t.reason[:300], "metric": _metric_of(t), "newest": t.nth == 1}
        for t in AlarmTransition.objects.filter(job=job, to_state=RuleState.ALARM).exclude(from_state=RuleState.ALARM)
        .annotate(nth=newest_first).filter(nth__lte=MARKS_PER_RULE).select_related("rule").order_by("at", "pk")]
    rows = [{"rule": r, "badge": STATE_BADGES.get(r.state, "grey"), "actions": action_words(r.actions)} for r in rules]
    request = context.get("request")
    refused = None
    session = getattr(request, "session", None)
    if session is not None and form_key(job.pk) in session:
        refused = session.pop(form_key(job.pk))
    return mark_safe(render_to_string("jobs/_rules.html", {  # noqa: S308 - the template escapes every value
        "job": job, "rows": rows, "transitions": transitions, "marks": marks, "refused": refused,
        "firing": sum(1 for r in rules if r.state == RuleState.ALARM and r.enabled),
        "finished": job.is_finished(),
        "can_edit": bool(context.get("can_write")) and not job.is_finished(),
        "types": [(t, DEFAULTS_SHOWN.get(t, "")) for t in RULE_TYPES], "states": STATES,
        "channels": list(NotificationChannel.objects.filter(project_id=job.project_id).only("name", "kind", "enabled"))
        if context.get("can_write") and not job.is_finished() else []}, request=request))
