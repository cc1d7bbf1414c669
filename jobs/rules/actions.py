"""What a rule's transition does. Per action of the rule:

- `stop`: on a transition into ALARM, the job is asked to stop (jobs.actions.stop_job):
  it ends `Stopped` with stop_reason `RuleTriggered` and `stop_rule` naming the rule. The
  agent's usual stop path runs (SIGTERM, grace, SIGKILL) and syncs the checkpoints, so the
  newest checkpoint is kept; a tuning job counts the trial as pruned.
- `tag`: on a transition into ALARM, the tag is added to the job's tags (once).
- `notify`: on every transition — or, with `on` (["ALARM"], ["ALARM", "OK"]), on those
  into the states listed — one delivery per channel of the project, or of its `channels`
  (studio.notify: a signed webhook POST or an e-mail, retried with back-off, each delivery
  recorded). A channel that is down never affects the job.

A transition inside the rule's cool-down (`fire` false) is recorded and does nothing.
Each action's outcome is kept on the transition (`actions_taken`)."""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Any

from django.db import transaction

from jobs.models import RULE_TRIGGERED, AlarmTransition, JobEvent, JobRule, TrainingJob
from jobs.rules.common import STATES
from jobs.rules.engine import ALARM, Transition
from jobs.transitions import note

log = logging.getLogger(__name__)

ALARM_EVENT = "alarm.transition"
TIMELINE_NOTES_PER_RULE = 20


def take_actions(rule: JobRule, row: AlarmTransition, t: Transition) -> list[dict[str, Any]]:
    taken: list[dict[str, Any]] = []
    into_alarm = t.to_state == ALARM and t.from_state != ALARM
    if into_alarm:
        _timeline(rule, f"ALARM: {t.reason}")
    elif t.from_state == ALARM and t.to_state != ALARM:
        _timeline(rule, f"{t.to_state} again: {t.reason}")
    if not t.fire:
        return [{"type": "none", "reason": "inside the rule's cool-down"}] if rule.actions else []
    job: TrainingJob | None = None  # read once, by the first action that needs it
    for action in rule.actions:
        kind = action.get("type")
        if kind == "tag" and into_alarm:
            taken.append(_tag(rule, action.get("tag") or f"alarm:{rule.name}"))
        elif kind == "stop" and into_alarm:
            job = job or TrainingJob.objects.select_related("project").get(pk=rule.job_id)
            taken.append(_stop(rule, job, t))
        elif kind == "notify" and t.to_state in (action.get("on") or STATES):
            job = job or TrainingJob.objects.select_related("project").get(pk=rule.job_id)
            taken.append(_notify(rule, job, row, t, action.get("channels")))
    return taken


def _timeline(rule: JobRule, message: str) -> None:
    """A note on the job's timeline, up to TIMELINE_NOTES_PER_RULE per rule: a rule that
    flaps would otherwise bury the status changes under its entries (its alarm history
    keeps every transition)."""
    prefix = f"rule {rule.name}: "
    written = JobEvent.objects.filter(job_id=rule.job_id, message__startswith=prefix).count()
    if written < TIMELINE_NOTES_PER_RULE:
        note(rule.job_id, prefix + message)
    elif written == TIMELINE_NOTES_PER_RULE:
        note(rule.job_id, prefix + f"changed state {TIMELINE_NOTES_PER_RULE} times; its further changes are left out of "
                                   f"the timeline (every one is in the job's alarm history, "
                                   f"/api/v1/jobs/{rule.job_id}/alarm-transitions/).")


def _stop(rule: JobRule, job: TrainingJob, t: Transition) -> dict[str, Any]:
    from jobs.actions import NotStoppable, stop_job

    try:
        stopped = stop_job(job, reason=RULE_TRIGGERED, rule=rule.name, message=f"{RULE_TRIGGERED}: rule {rule.name}: {t.reason}")
    except NotStoppable as exc:
        return {"type": "stop", "result": "not stoppable", "detail": str(exc)}
    if stopped.stop_rule != rule.name:
        return {"type": "stop", "result": "already stopping", "status": stopped.status}
    log.info("job %s: stop requested by rule %s (%s)", rule.job_id, rule.name, t.reason)
    return {"type": "stop", "result": "requested", "status": stopped.status}


def _tag(rule: JobRule, tag: str) -> dict[str, Any]:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().only("tags").get(pk=rule.job_id)
        tags = list(job.tags or [])
        if tag in tags:
            return {"type": "tag", "tag": tag, "result": "already tagged"}
        TrainingJob.objects.filter(pk=rule.job_id).update(tags=[*tags, tag])
    return {"type": "tag", "tag": tag, "result": "added"}


def alarm_payload(rule: JobRule, job: TrainingJob, row: AlarmTransition, t: Transition) -> dict[str, Any]:
    from studio.notify import public_link

    url = public_link(f"/jobs/{rule.job_id}/")
    at = row.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    where = f", step {t.step}" if t.step is not None else ""
    text = "\n".join(line for line in (
        f"{t.to_state}: rule {rule.name} ({rule.type}) on job {job.name} (#{rule.job_id}, project {job.project.slug})",
        f"Why: {t.reason}",
        f"{t.from_state} → {t.to_state} at {at}{where}; the job is {job.status}.",
        url) if line)
    return {
        "summary": f"{job.name}: rule {rule.name} is {t.to_state} ({t.reason})",
        "text": text,
        "url": url,
        "job": {"id": rule.job_id, "name": job.name, "status": job.status, "project": job.project.slug},
        "rule": {"id": rule.pk, "name": rule.name, "type": rule.type},
        "transition": {"id": row.pk, "from": t.from_state, "to": t.to_state, "at": row.at.isoformat(), "step": t.step,
                       "reason": t.reason, "values": row.values},
    }


def _notify(rule: JobRule, job: TrainingJob, row: AlarmTransition, t: Transition,
            channels: list[str] | None) -> dict[str, Any]:
    from studio.notify import notify

    ids = notify(job.project_id, ALARM_EVENT, alarm_payload(rule, job, row, t), channels=channels)
    if ids:
        return {"type": "notify", "deliveries": ids}
    # Said on the transition (the job page shows it): an alarm that reached no one.
    if not channels:
        why = "the project has no enabled channel"
    elif len(channels) == 1:
        why = f"{channels[0]} is not an enabled channel of the project"
    else:
        why = f"none of {', '.join(channels)} is an enabled channel of the project"
    return {"type": "notify", "deliveries": [], "result": f"not sent: {why}"}
