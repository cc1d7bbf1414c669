"""A rule's state in the database: its transitions stored with their time and values, and
its row kept in step, in one transaction; then what the transition does (jobs.rules.actions).

The watcher (jobs.rules.watcher) is the only writer of states; the API writes definitions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.models import AlarmTransition, JobRule
from jobs.rules.common import _json_safe as json_safe  # the engine's: NaN/±Inf as strings for jsonb
from jobs.rules.engine import Transition, evaluator

log = logging.getLogger(__name__)


def waiting_reason(spec: dict) -> str:
    """What a new rule waits for, in words (its first INSUFFICIENT_DATA reason)."""
    try:
        return evaluator(spec, started_at=0.0).reason
    except Exception:  # noqa: BLE001 - a reason is a nicety; the rule was checked already
        return "waiting for data"


def moment(unix: float) -> datetime:
    try:
        return datetime.fromtimestamp(unix, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return timezone.now()


def record(rule: JobRule, transitions: Sequence[Transition]) -> list[AlarmTransition]:
    """Store the transitions and the rule's new state, then run the actions of each one
    (after the commit: a stop or a delivery never sees a state that did not commit).
    Returns the stored rows with their `actions_taken` filled in."""
    if not transitions:
        return []
    from jobs.rules.actions import take_actions

    now = timezone.now()
    last = transitions[-1]
    with transaction.atomic():
        rows = AlarmTransition.objects.bulk_create([
            AlarmTransition(rule_id=rule.pk, job_id=rule.job_id, from_state=t.from_state, to_state=t.to_state,
                            at=moment(t.at), step=t.step, reason=t.reason[:4000], values=json_safe(t.values))
            for t in transitions])
        changed = any(t.from_state != t.to_state for t in transitions)
        fields: dict[str, Any] = {"state": last.to_state, "state_reason": last.reason[:4000],
                                  "state_values": json_safe(last.values), "last_evaluated_at": now}
        if changed:
            fields["state_changed_at"] = moment(last.at)
        JobRule.objects.filter(pk=rule.pk).update(**fields)
        for name, value in fields.items():
            setattr(rule, name, value)
    for row, t in zip(rows, transitions, strict=True):
        try:
            taken = take_actions(rule, row, t)
        except Exception as exc:  # noqa: BLE001 - an action's failure is recorded, never raised into the stream
            log.exception("job %s rule %s: actions failed", rule.job_id, rule.name)
            taken = [{"type": "error", "error": str(exc)[:500]}]
        if taken:
            row.actions_taken = taken
            AlarmTransition.objects.filter(pk=row.pk).update(actions_taken=taken)
    return rows


# --- definitions (the API's and the pages' writes) ---------------------------------------------
class RuleConflict(Exception):
    """The job is finished: its rules no longer change (a 409)."""


def add_rule(job_id: int, raw: Any, *, job_finished: bool) -> JobRule:
    """Check and add one rule to a job; RuleError names the bad field; a duplicate name is a
    RuleError on "name". The watcher picks it up within DISCOVER_SECONDS."""
    from jobs.rules.engine import RuleError, check_rule

    if job_finished:
        raise RuleConflict("The job has finished; rules can be added only to pending or running jobs.")
    spec = check_rule(raw)
    if JobRule.objects.filter(job_id=job_id, name=spec["name"]).exists():
        raise RuleError("name", f"The job already has a rule named {spec['name']!r}; pick another name or PATCH that one.")
    return JobRule.objects.create(job_id=job_id, name=spec["name"], type=spec["type"], parameters=spec["parameters"],
                                  actions=spec["actions"], enabled=spec["enabled"], state_reason=waiting_reason(spec))


def spec_of(rule: JobRule) -> dict:
    return {"name": rule.name, "type": rule.type, "parameters": dict(rule.parameters), "actions": list(rule.actions),
            "enabled": rule.enabled}


def update_rule(rule: JobRule, raw: Any, *, job_finished: bool) -> JobRule:
    """Change a rule's parameters, actions, enabled or name (not its type); re-checked whole."""
    from jobs.rules.engine import RuleError, check_rule

    if job_finished:
        raise RuleConflict("The job has finished; its rules no longer change.")
    spec = check_rule(raw, partial=spec_of(rule))
    if spec["name"] != rule.name and JobRule.objects.filter(job_id=rule.job_id, name=spec["name"]).exists():
        raise RuleError("name", f"The job already has a rule named {spec['name']!r}.")
    rule.name, rule.parameters, rule.actions, rule.enabled = spec["name"], spec["parameters"], spec["actions"], spec["enabled"]
    rule.updated_at = timezone.now()
    rule.save(update_fields=["name", "parameters", "actions", "enabled", "updated_at"])
    return rule


def delete_rule(rule: JobRule, *, job_finished: bool) -> None:
    """Delete a rule and its transitions; a finished job's rules and history are kept."""
    if job_finished:
        raise RuleConflict("The job has finished; its rules and their history are kept.")
    rule.delete()
