"""A rule's state in the database: its transitions stored with their time and values, and
its row kept in step, in one transaction; then what the transition does (jobs.rules.actions).

The watcher (jobs.rules.watcher) is the only writer of states; the API writes definitions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis
from django.db import connection, models, transaction
from django.db.models import Max
from django.utils import timezone

from jobs.models import AlarmTransition, JobRule, MetricChunk
from jobs.rules.common import _json_safe as json_safe  # the engine's: NaN/±Inf as strings for jsonb
from jobs.rules.engine import ALARM, Transition, evaluator

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
    return record_many([(rule, transitions)])


_STATE_FIELDS = ["state", "state_reason", "state_values", "last_evaluated_at", "state_changed_at"]


def _update_states(rules: list[JobRule]) -> None:
    """The rules' state fields, one UPDATE statement run for each rule (executemany: one
    round trip on psycopg 3). Django's bulk_update builds a CASE WHEN of every field for
    every row, which cost the watcher ~0.2 s of CPU for a cycle's 100 first transitions."""
    fields = [f for name in _STATE_FIELDS if isinstance(f := JobRule._meta.get_field(name), models.Field)]
    quote = connection.ops.quote_name
    sql = (f"UPDATE {quote(JobRule._meta.db_table)} SET " + ", ".join(f"{quote(f.column)} = %s" for f in fields)
           + f" WHERE {quote(JobRule._meta.pk.column)} = %s")
    params = [[f.get_db_prep_save(getattr(rule, f.attname), connection) for f in fields] + [rule.pk] for rule in rules]
    with connection.cursor() as cursor:
        cursor.executemany(sql, params)


def _clock_alarm(t: Transition) -> bool:
    """An alarm no point caused (stalled, max_init_time, budget, low GPU use, missing data):
    it has no step of its own."""
    return t.step is None and ALARM in (t.to_state, t.from_state) and t.from_state != t.to_state


def _steps_reached(changes: Sequence[tuple[JobRule, Sequence[Transition]]]) -> dict[int, int]:
    """The last step each job had stored, for the jobs with a clock alarm among `changes`:
    one query over the jobs' chart chunks (a few thousand rows for a million points)."""
    jobs = {rule.job_id for rule, transitions in changes if any(_clock_alarm(t) for t in transitions)}
    if not jobs:
        return {}
    rows = MetricChunk.objects.filter(job_id__in=jobs).values("job_id").annotate(step=Max("last_step"))
    return {row["job_id"]: row["step"] for row in rows if row["step"] is not None}


def _with_step_reached(t: Transition, step: int | None) -> dict[str, Any]:
    """A clock alarm's values with `step_reached`, the last step the job had reported: the
    charts mark it there (a stall at the end of the curve). `step` stays None: no point
    caused it."""
    if step is None or not _clock_alarm(t) or not isinstance(t.values, dict):
        return t.values
    return {**t.values, "step_reached": step}


def record_many(changes: Sequence[tuple[JobRule, Sequence[Transition]]]) -> list[AlarmTransition]:
    """record() for several rules at once — what one watcher cycle caused, in one
    transaction: one INSERT of every transition and one UPDATE of the rules' states. Then
    each transition's actions, in order."""
    listed = [(rule, list(transitions)) for rule, transitions in changes if transitions]
    if not listed:
        return []
    from jobs.rules.actions import take_actions

    now = timezone.now()
    with transaction.atomic():
        changes = _still_current(listed)
        if not changes:
            return []
        reached = _steps_reached(changes)
        rows = AlarmTransition.objects.bulk_create([
            AlarmTransition(rule_id=rule.pk, job_id=rule.job_id, from_state=t.from_state, to_state=t.to_state,
                            at=moment(t.at), step=t.step, reason=t.reason[:4000],
                            values=json_safe(_with_step_reached(t, reached.get(rule.job_id))))
            for rule, transitions in changes for t in transitions])
        rules: dict[int, JobRule] = {}
        for rule, transitions in changes:
            last = transitions[-1]
            rule.state, rule.state_reason = last.to_state, last.reason[:4000]
            rule.state_values, rule.last_evaluated_at = json_safe(last.values), now
            if any(t.from_state != t.to_state for t in transitions):
                rule.state_changed_at = moment(last.at)
            rules[rule.pk] = rule  # a rule twice in one cycle: its last state is the object's
        _update_states(list(rules.values()))
    taken_rows = []
    stored = iter(rows)
    for rule, transitions in changes:
        for t in transitions:
            row = next(stored)
            try:
                taken = take_actions(rule, row, t)
            except Exception as exc:  # noqa: BLE001 - an action's failure is recorded, never raised into the stream
                log.exception("job %s rule %s: actions failed", rule.job_id, rule.name)
                taken = [{"type": "error", "error": str(exc)[:500]}]
            if taken:
                row.actions_taken = taken
                taken_rows.append(row)
    if taken_rows:
        try:
            AlarmTransition.objects.bulk_update(taken_rows, ["actions_taken"])
        except Exception:  # noqa: BLE001 - the transitions are stored and acted on; only the note of it is lost
            log.exception("could not note the actions of %d transition(s)", len(taken_rows))
    return rows


def _still_current(changes: list[tuple[JobRule, list[Transition]]]) -> list[tuple[JobRule, list[Transition]]]:
    """The changes whose rule is still as the watcher read it: a rule deleted, turned off or
    redefined since (a PATCH between two of its discoveries) judged by a definition that no
    longer holds, so what it found is dropped — a rule turned off never alarms after the
    PATCH returned. The rows are locked against a PATCH until the commit; the watcher's next
    evaluator starts from the stored state (jobs.rules.watcher._sync_rules)."""
    current = dict(JobRule.objects.select_for_update().filter(pk__in=[rule.pk for rule, _ in changes])
                   .values_list("pk", "updated_at").filter(enabled=True))
    kept = [(rule, transitions) for rule, transitions in changes if current.get(rule.pk) == rule.updated_at]
    if len(kept) < len(changes):
        log.info("dropped the transitions of %d rule(s) changed, turned off or deleted since the watcher read them",
                 len(changes) - len(kept))
    return kept


# --- definitions (the API's and the pages' writes) ---------------------------------------------
RULES_CHANGED_KEY = "trainyard:rules:changed"  # bumped on each change: the watcher then looks at once


def _tell_watcher() -> None:
    """After the commit, bump RULES_CHANGED_KEY: the watcher rereads the rules in its next
    cycle instead of at its next discovery (up to DISCOVER_SECONDS later). Redis down: it
    still does then."""
    def bump() -> None:
        from jobs.metrics import metrics_redis

        try:
            client = metrics_redis()
            client.incr(RULES_CHANGED_KEY)
            client.close()
        except redis.RedisError:
            log.info("could not tell the rule watcher of a change; it sees it at its next discovery")

    transaction.on_commit(bump)


def _changed_reason(rule: JobRule, before: dict, now: datetime) -> str:
    """The rule's state_reason after a PATCH: its stored reason was the old definition's."""
    at = now.astimezone(UTC).strftime("%H:%M:%S UTC")
    if before["enabled"] and not rule.enabled:
        return f"Turned off at {at}: not evaluated; it was {rule.state}."
    if not rule.enabled:
        return f"Changed at {at} while off: not evaluated until it is turned on."
    if rule.enabled and not before["enabled"]:
        return f"Turned on at {at}: evaluated from the job's next points; {rule.state} until then."
    return (f"Changed at {at}: evaluated from the job's next points; {rule.state} until then (the earlier "
            f"definition's verdict, in the alarm history).")


class RuleConflict(Exception):
    """The job is finished: its rules no longer change (a 409)."""


def _channel_names(spec: dict) -> set[str]:
    return {name.casefold() for action in spec.get("actions") or [] if action.get("type") == "notify"
            for name in action.get("channels") or []}


def check_channels_exist(project_id: int, specs: Sequence[dict], *, lone: bool = False,
                         kept: set[str] | None = None) -> None:
    """Every channel a notify action names must be one of the project's (enabled or not: an
    admin may turn one off for a while): a misspelt name would send the alarm nowhere.
    RuleError names the first unknown one under its spec's path: `rules[1].actions[0].channels[2]`,
    or `actions[0].channels[2]` for a `lone` rule (the rules API's body)."""
    from jobs.rules.engine import RuleError
    from studio.models import NotificationChannel

    named = [(index, position, where, name)
             for index, spec in enumerate(specs)
             for position, action in enumerate(spec.get("actions") or [])
             if action.get("type") == "notify" and action.get("channels")
             for where, name in enumerate(action["channels"])]
    if not named:
        return
    names = sorted(NotificationChannel.objects.filter(project_id=project_id).values_list("name", flat=True))
    known = {name.casefold() for name in names} | (kept or set())
    for index, position, where, name in named:
        if name.casefold() in known:  # without case, as channel names are unique
            continue
        base = "" if lone else f"rules[{index}]."
        listed = ", ".join(repr(channel) for channel in names[:20])
        raise RuleError(f"{base}actions[{position}].channels[{where}]",
                        f"the project has no notification channel named {name!r}"
                        + (f"; its channels are {listed}." if listed else
                           "; it has none yet (a project admin adds them on the project's Notifications page)."))


def add_rule(job_id: int, raw: Any, *, job_finished: bool, project_id: int) -> JobRule:
    """Check and add one rule to a job; RuleError names the bad field; a duplicate name is a
    RuleError on "name". The watcher picks it up within DISCOVER_SECONDS."""
    from jobs.rules.engine import RuleError, check_rule

    if job_finished:
        raise RuleConflict("The job has finished; rules can be added only to pending or running jobs.")
    spec = check_rule(raw)
    check_channels_exist(project_id, [spec], lone=True)
    if JobRule.objects.filter(job_id=job_id, name=spec["name"]).exists():
        raise RuleError("name", f"The job already has a rule named {spec['name']!r}; pick another name or PATCH that one.")
    rule = JobRule.objects.create(job_id=job_id, name=spec["name"], type=spec["type"], parameters=spec["parameters"],
                                  actions=spec["actions"], enabled=spec["enabled"],
                                  state_reason=waiting_reason(spec) if spec["enabled"] else "Off: not evaluated until it is turned on.")
    _tell_watcher()
    return rule


def spec_of(rule: JobRule) -> dict:
    return {"name": rule.name, "type": rule.type, "parameters": dict(rule.parameters), "actions": list(rule.actions),
            "enabled": rule.enabled}


def update_rule(rule: JobRule, raw: Any, *, job_finished: bool, project_id: int, name_field: str = "name") -> JobRule:
    """Change a rule's parameters, actions, enabled or name (not its type); re-checked whole.
    A changed definition says so in its state_reason and reaches the watcher at once; a
    name taken already is a RuleError on `name_field` (the API's "new_name" where that gave it)."""
    from jobs.rules.engine import RuleError, check_rule

    if job_finished:
        raise RuleConflict("The job has finished; its rules no longer change.")
    spec = check_rule(raw, partial=spec_of(rule))
    # Only the names this change brings: a channel renamed or deleted since the rule was made
    # must not lock the rule against every PATCH (turning it off included); its alarms say
    # "not sent" until its actions name a channel that exists.
    check_channels_exist(project_id, [spec], lone=True, kept=_channel_names(spec_of(rule)))
    if spec["name"] != rule.name and JobRule.objects.filter(job_id=rule.job_id, name=spec["name"]).exists():
        raise RuleError(name_field, f"The job already has a rule named {spec['name']!r}.")
    before = spec_of(rule)
    rule.name, rule.parameters, rule.actions, rule.enabled = spec["name"], spec["parameters"], spec["actions"], spec["enabled"]
    now = timezone.now()
    if {k: v for k, v in spec_of(rule).items() if k != "name"} != {k: v for k, v in before.items() if k != "name"}:
        rule.state_reason = _changed_reason(rule, before, now)  # a rename alone: the verdict stands
    rule.updated_at = now
    with transaction.atomic():
        JobRule.objects.select_for_update().filter(pk=rule.pk).first()  # after a cycle storing this rule's verdict
        rule.save(update_fields=["name", "parameters", "actions", "enabled", "state_reason", "updated_at"])
        _tell_watcher()
    return rule


def delete_rule(rule: JobRule, *, job_finished: bool) -> None:
    """Delete a rule and its transitions; a finished job's rules and history are kept."""
    if job_finished:
        raise RuleConflict("The job has finished; its rules and their history are kept.")
    rule.delete()
    _tell_watcher()
