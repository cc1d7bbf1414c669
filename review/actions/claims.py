"""Writes of human review (SPEC §5), each one transaction.

Lock order everywhere: the loop row, then its assignment rows. Slot counters on the
loop (answers_needed, answers_count, holds_count, open_slots) change only under the
loop's row lock or through a compare-and-set UPDATE (open_slots > 0), so no slot is
ever held twice and no answer is lost or counted twice.
"""

from __future__ import annotations

import contextlib
import logging
import random
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from review.activation import activation_reason
from review.models import (
    LIVE_ASSIGNMENT_STATUSES,
    MAX_ESCALATIONS,
    NO_CONSENSUS,
    Assignment,
    AssignmentStatus,
    FlowDefinition,
    HumanLoop,
    LoopOrder,
    LoopStatus,
    TaskType,
    WorkTeam,
)
from studio.models import json_column

log = logging.getLogger(__name__)

LOOP_NAME_MAX = 128
CLAIM_CANDIDATES = 8  # how many loops one claim tries before giving up (lost races on SQLite)
EXPIRE_BATCH = 200  # leases/loops handled per beat step, so one tick stays short
CLAIM_EXPIRY_BATCH = 20  # expired leases a claim returns before it looks (beat does the rest)
OUTPUT_RETRY_AFTER = timedelta(seconds=10)  # leave a fresh completion to its own write task


class ReviewError(Exception):
    """Bad input or a state conflict, with the request field it concerns."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status


class LoopNameTaken(ReviewError):
    def __init__(self, name: str):
        super().__init__("name", f"A human loop named '{name}' already exists.", status=409)


class AssignmentConflict(ReviewError):
    """The assignment cannot take this answer/release any more (409)."""

    def __init__(self, message: str):
        super().__init__("assignment", message, status=409)


# --- teams and flows ------------------------------------------------------------------------
def create_work_team(*, project, name: str, members: Sequence, user, description: str = "") -> WorkTeam:
    """A team of the project's members. Members must belong to the project (any role)."""
    from studio.models import Membership

    member_ids = {m.pk for m in members}
    in_project = set(Membership.objects.filter(project=project, user_id__in=member_ids).values_list("user_id", flat=True))
    outside = [m.username for m in members if m.pk not in in_project]
    if outside:
        raise ReviewError("members", f"Not members of project '{project.slug}': {', '.join(sorted(outside))}.")
    try:
        with transaction.atomic():
            team = WorkTeam.objects.create(project=project, name=name, description=description, created_by=user)
            team.members.set(members)
    except IntegrityError as exc:
        raise ReviewError("name", f"A work team named '{name}' already exists in this project.", status=409) from exc
    return team


def create_flow_definition(*, project, user, data: dict[str, Any]) -> FlowDefinition:
    """A flow from validated serializer data (shapes are checked there; here what needs
    the database: the team and its size)."""
    from review.markdown import render_instructions

    team = data["work_team"]
    if team.project_id != project.pk:
        raise ReviewError("work_team", "The work team belongs to another project.")
    size = team.members.count()
    task_count = data.get("task_count", 1)
    if task_count > size:
        raise ReviewError("task_count", f"Must be at most the work team's size ({size} member{'s' if size != 1 else ''}).")
    instructions = data.get("instructions", "")
    fields = {k: v for k, v in data.items() if k in {
        "task_type", "labels", "title", "task_count", "task_availability_seconds", "task_time_limit_seconds",
        "activation", "order", "show_prediction"}}
    try:
        with transaction.atomic():
            return FlowDefinition.objects.create(project=project, name=data["name"], work_team=team,
                                                 instructions=instructions,
                                                 instructions_html=render_instructions(instructions),
                                                 created_by=user, **fields)
    except IntegrityError as exc:
        raise ReviewError("name", f"A flow definition named '{data['name']}' already exists in this project.",
                          status=409) from exc


# --- starting loops -------------------------------------------------------------------------
def confidence_of(prediction: dict | None) -> float | None:
    """The prediction's confidence as a float (numpy scalars included), or None."""
    value = prediction.get("confidence") if isinstance(prediction, dict) else None
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN sorts nowhere: treat as unknown


def _new_loop(*, name: str, flow: FlowDefinition, input_content: dict, prediction: dict | None, reason: str,
              source: dict, model_version, user, now: datetime) -> HumanLoop:
    return HumanLoop(
        name=name, project_id=flow.project_id, flow_definition=flow, input_content=input_content,
        prediction=prediction, confidence=confidence_of(prediction), activation_reason=reason, source=source or {},
        model_version=model_version, answers_needed=flow.task_count, open_slots=flow.task_count,
        created_by=user if user is not None and getattr(user, "is_authenticated", False) else None,
        created_at=now, expires_at=now + timedelta(seconds=flow.task_availability_seconds),
    )


def start_human_loop(*, name: str, flow: FlowDefinition, input_content: dict, user=None,
                     prediction: dict | None = None, activation_reason: str = "api",
                     source: dict | None = None, model_version=None) -> HumanLoop:
    """StartHumanLoop: one loop, whatever the activation conditions say."""
    name = (name or "").strip()
    if not name:
        raise ReviewError("name", "This field may not be blank.")
    if len(name) > LOOP_NAME_MAX:
        raise ReviewError("name", f"At most {LOOP_NAME_MAX} characters.")
    if any(ord(ch) < 32 or ch in "/\x7f" for ch in name):
        raise ReviewError("name", "Names cannot contain '/' or control characters.")
    if not isinstance(input_content, dict):
        raise ReviewError("input_content", "Must be a JSON object.")
    loop = _new_loop(name=name, flow=flow, input_content=input_content, prediction=prediction,
                     reason=activation_reason, source=source or {}, model_version=model_version, user=user,
                     now=timezone.now())
    try:
        with transaction.atomic():
            loop.save(force_insert=True)
    except IntegrityError as exc:
        if HumanLoop.objects.filter(name=name).exists():
            raise LoopNameTaken(name) from exc
        raise
    return loop


def start_loops_for_predictions(flow: FlowDefinition | None, items: Sequence[tuple[dict, dict]], *,
                                source: dict, model_version=None, rng: random.Random | None = None,
                                first_record: int = 0) -> list[str]:
    """Start a loop for each (input_content, prediction) the flow's activation selects.
    One INSERT for the lot; returns the names started ([] without a flow). A batch's loops
    (source has "batch") record which record they are: first_record + their index."""
    if flow is None or not items:
        return []
    activation = flow.activation or {}
    now = timezone.now()
    prefix = flow.name[:40]
    loops: list[HumanLoop] = []
    for index, (content, prediction) in enumerate(items):
        reason = activation_reason(activation, confidence_of(prediction), rng)
        if reason is None:
            continue
        item_source = dict(source)
        if "batch" in source and "record" not in source:
            item_source["record"] = first_record + index
        loops.append(_new_loop(name=f"{prefix}-{uuid.uuid4().hex[:16]}", flow=flow,
                               input_content=content if isinstance(content, dict) else {"value": content},
                               prediction=prediction, reason=reason, source=item_source,
                               model_version=model_version, user=None, now=now))
    if loops:
        HumanLoop.objects.bulk_create(loops, batch_size=1000)
    return [loop.name for loop in loops]


# --- claims ---------------------------------------------------------------------------------
def _candidate_rows(user, flow_id: int, order: str, now: datetime, limit: int) -> list[int]:
    """Ids of the flow's open loops the user holds, answered or skipped nothing of, in the
    flow's order: the claim candidates where rows cannot be locked (SQLite; PostgreSQL
    claims with _CLAIM_SQL)."""
    mine = Assignment.objects.filter(loop=OuterRef("pk"), worker=user, status__in=LIVE_ASSIGNMENT_STATUSES)
    loops = (HumanLoop.objects.filter(flow_definition_id=flow_id, status=LoopStatus.IN_PROGRESS,
                                      open_slots__gt=0, expires_at__gt=now)
             .filter(~Exists(mine)))
    if order == LoopOrder.LEAST_CONFIDENT:
        loops = loops.order_by(F("confidence").asc(nulls_last=True), "id")
    else:
        loops = loops.order_by("created_at", "id")
    return list(loops.values_list("id", flat=True)[:limit])


def _move_slot(loop_id: int) -> bool:
    """Compare-and-set: one slot of the loop from open to held, if one is still open."""
    return bool(HumanLoop.objects.filter(pk=loop_id, status=LoopStatus.IN_PROGRESS, open_slots__gt=0)
                .update(open_slots=F("open_slots") - 1, holds_count=F("holds_count") + 1))


def _hold(loop_id: int, user, lease_seconds: int, now: datetime) -> Assignment:
    return Assignment.objects.create(loop_id=loop_id, worker=user, status=AssignmentStatus.HELD, claimed_at=now,
                                     lease_expires_at=now + timedelta(seconds=lease_seconds))


def _take_slot(loop_id: int, user, lease_seconds: int, now: datetime) -> Assignment | None:
    """Move one slot of the loop from open to held and record the hold; None if the slot
    went to someone else first (or the user got this loop in another session)."""
    try:
        with transaction.atomic():  # a savepoint: a lost race undoes only this attempt
            if not _move_slot(loop_id):
                return None
            return _hold(loop_id, user, lease_seconds, now)
    except IntegrityError:
        return None


# The flows a reviewer may claim from (their work teams'), with every field a claim and its
# response need: plain SQL, read once per claim (the ORM's query building cost more than
# the query). {only} narrows it to one flow.
_REVIEWABLE_FLOWS_SQL = """
SELECT f.id, f.name, f.title, f.task_type, f.labels, f.instructions_html, f.show_prediction,
       f.task_time_limit_seconds, f."order"
FROM review_flowdefinition f
WHERE {only} EXISTS (SELECT 1 FROM {members} m WHERE m.workteam_id = f.work_team_id AND m.user_id = %s)
ORDER BY f.id
"""


def reviewable_flows(user, flow_id: int | None = None) -> list[FlowDefinition]:
    """The flows whose items the user may claim, by id ([] or [that flow] with flow_id).
    Partial instances: the fields claims and claim_json read, never saved."""
    sql = _REVIEWABLE_FLOWS_SQL.format(only="f.id = %s AND" if flow_id is not None else "",
                                       members=WorkTeam.members.through._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, [flow_id, user.pk] if flow_id is not None else [user.pk])
        rows = cursor.fetchall()
    return [FlowDefinition(id=pk, name=name, title=title, task_type=task_type, labels=json_column(labels),
                           instructions_html=instructions_html, show_prediction=bool(show_prediction),
                           task_time_limit_seconds=lease_seconds, order=order)
            for pk, name, title, task_type, labels, instructions_html, show_prediction, lease_seconds, order in rows]


def claim_next_slot(user, flow: FlowDefinition | int | None = None) -> Assignment | None:
    """Hold the next slot the user may answer, for the flow's task_time_limit_seconds;
    None when there is nothing for them (or the flow is not theirs to review). Without a
    flow: the user's teams' flows in turn (by id), each in its own order."""
    flow_id = flow.pk if isinstance(flow, FlowDefinition) else flow
    return claim_in_flows(user, reviewable_flows(user, flow_id))


def claim_in_flows(user, flows: Sequence[FlowDefinition]) -> Assignment | None:
    """The claim over flows from reviewable_flows, in turn. One flow at a time keeps every
    candidate query on its partial index; a query over several flows at once would sort
    their whole backlog. The assignment comes with .loop (name, input_content,
    prediction) and .loop.flow_definition set: what claim_json shows."""
    if not flows:
        return None
    now = timezone.now()
    # Leases that ran out give their slots back before we look: a claim never waits on
    # beat. One indexed query when none has (the partial index assignment_lease).
    expire_leases(now, limit=CLAIM_EXPIRY_BATCH)
    for flow in flows:
        assignment = _claim_in(user, flow, now)
        if assignment is not None:
            assignment.loop.flow_definition = flow
            return assignment
    return None


# PostgreSQL: the whole claim is one statement (ARCHITECTURE: the lean path on hot
# endpoints): pick the first open loop of the flow that the reviewer holds, answered or
# skipped nothing of, locked with SKIP LOCKED so concurrent claimers never wait on one
# another or get the same row; move one of its slots from open to held; insert the hold;
# return the hold with what the reviewer is shown of the loop. The membership check rides
# along, so a non-member gets nothing. The ORDER BY matches the partial indexes
# loop_claim_oldest / loop_claim_least_confident.
_CLAIM_SQL = """
WITH candidate AS (
    SELECT l.id FROM review_humanloop l
    WHERE l.flow_definition_id = %(flow)s AND l.status = 'InProgress' AND l.open_slots > 0
      AND l.expires_at > %(now)s
      AND EXISTS (SELECT 1 FROM review_flowdefinition f JOIN {members} m ON m.workteam_id = f.work_team_id
                  WHERE f.id = %(flow)s AND m.user_id = %(user)s)
      AND NOT EXISTS (SELECT 1 FROM review_assignment a WHERE a.loop_id = l.id AND a.worker_id = %(user)s
                      AND a.status IN ('held', 'answered', 'released'))
    ORDER BY {order}
    LIMIT 1
    FOR UPDATE OF l SKIP LOCKED
), moved AS (
    UPDATE review_humanloop h SET open_slots = h.open_slots - 1, holds_count = h.holds_count + 1
    FROM candidate WHERE h.id = candidate.id AND h.open_slots > 0
    RETURNING h.id, h.name, h.input_content, h.prediction
), held AS (
    INSERT INTO review_assignment (loop_id, worker_id, status, claimed_at, lease_expires_at)
    SELECT moved.id, %(user)s, 'held', %(now)s, %(lease)s FROM moved
    RETURNING id, loop_id
)
SELECT held.id, moved.id, moved.name, moved.input_content, moved.prediction
FROM held JOIN moved ON moved.id = held.loop_id
"""
_CLAIM_ORDER = {LoopOrder.OLDEST: "l.created_at, l.id", LoopOrder.LEAST_CONFIDENT: "l.confidence ASC NULLS LAST, l.id"}


def claim_statement(user, flow_id: int, order: str, lease_seconds: int, now: datetime) -> tuple[str, dict]:
    """The PostgreSQL claim as (sql, params); bench/review.py explains it."""
    sql = _CLAIM_SQL.format(members=WorkTeam.members.through._meta.db_table,
                            order=_CLAIM_ORDER.get(order, _CLAIM_ORDER[LoopOrder.OLDEST]))
    return sql, {"flow": flow_id, "user": user.pk, "now": now, "lease": now + timedelta(seconds=lease_seconds)}


def _claim_in_postgres(user, flow: FlowDefinition, now: datetime) -> Assignment | None:
    sql, params = claim_statement(user, flow.pk, flow.order, flow.task_time_limit_seconds, now)
    for _attempt in range(CLAIM_CANDIDATES):
        try:
            # One statement, atomic by itself (no BEGIN/COMMIT round trips); inside a
            # caller's transaction, a savepoint so a lost race does not poison it.
            guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
            with guard, connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
        except IntegrityError:
            # The same reviewer claiming in two sessions at once: look again.
            continue
        if row is None:
            return None
        assignment_id, loop_id, name, input_content, prediction = row
        assignment = Assignment(pk=assignment_id, loop_id=loop_id, worker=user, status=AssignmentStatus.HELD,
                                claimed_at=now, lease_expires_at=params["lease"])
        assignment.loop = HumanLoop(pk=loop_id, name=name, flow_definition_id=flow.pk, status=LoopStatus.IN_PROGRESS,
                                    input_content=json_column(input_content), prediction=json_column(prediction))
        return assignment
    return None


def _claim_in(user, flow: FlowDefinition, now: datetime) -> Assignment | None:
    """A claim within one flow the user may review. PostgreSQL: one statement. Elsewhere
    (SQLite) rows are not locked, so a few candidates are tried, each in a savepoint, and
    the compare-and-set plus the unique constraint keep one slot to one reviewer."""
    if connection.features.has_select_for_update_skip_locked:
        return _claim_in_postgres(user, flow, now)
    with transaction.atomic():
        for loop_id in _candidate_rows(user, flow.pk, flow.order, now, CLAIM_CANDIDATES):
            assignment = _take_slot(loop_id, user, flow.task_time_limit_seconds, now)
            if assignment is not None:
                assignment.loop = HumanLoop.objects.only("name", "flow_definition_id", "status", "input_content",
                                                         "prediction").get(pk=loop_id)
                return assignment
    return None


# --- answers and releases -------------------------------------------------------------------
def _locked(assignment_id: int, user) -> tuple[HumanLoop, Assignment]:
    """The assignment's loop locked, then the assignment read; ReviewError 404 when the
    assignment is unknown or someone else's. Call inside a transaction. Every change to
    a loop's assignments happens under the loop's row lock, so the assignment read after
    it is current."""
    owned = Assignment.objects.filter(pk=assignment_id, worker=user).values("loop_id")
    loop = (HumanLoop.objects.select_for_update(of=("self",))
            .select_related("flow_definition", "flow_definition__project")
            .filter(pk__in=owned).first())
    if loop is None:
        raise ReviewError("assignment", "No such assignment.", status=404)
    assignment = Assignment.objects.get(pk=assignment_id)
    return loop, assignment


def _return_slot(loop: HumanLoop, assignment: Assignment, status: str, now: datetime) -> None:
    """A held slot goes back to open (release, lease ran out). Loop row locked."""
    assignment.status = status
    assignment.ended_at = now
    assignment.save(update_fields=["status", "ended_at"])
    loop.holds_count -= 1
    if loop.status == LoopStatus.IN_PROGRESS:
        loop.open_slots += 1
    loop.save(update_fields=["holds_count", "open_slots"])


def _not_answerable(loop: HumanLoop, assignment: Assignment) -> str:
    if assignment.status == AssignmentStatus.ANSWERED:
        return "This assignment is already answered."
    if assignment.status == AssignmentStatus.RELEASED:
        return "This assignment was released."
    if assignment.status == AssignmentStatus.EXPIRED:
        if loop.status != LoopStatus.IN_PROGRESS:
            return f"The human loop is no longer in progress ({loop.status})."
        return "The assignment's lease expired; its slot went back to the queue."
    return f"The human loop is no longer in progress ({loop.status})."


def _still_held(loop: HumanLoop, assignment: Assignment, now: datetime) -> str | None:
    """None when the reviewer still holds the slot; else why not (for a 409). A lease
    found run out here gives its slot back on the spot (loop row locked)."""
    if assignment.status != AssignmentStatus.HELD or loop.status != LoopStatus.IN_PROGRESS:
        return _not_answerable(loop, assignment)
    if assignment.lease_expires_at <= now:
        _return_slot(loop, assignment, AssignmentStatus.EXPIRED, now)
        return "The assignment's lease expired; its slot went back to the queue."
    return None


def check_answer(flow: FlowDefinition, answer: Any) -> dict:
    if not isinstance(answer, dict):
        raise ReviewError("answer", "Must be an object: {\"label\": ...} or {\"text\": ...}.")
    if flow.task_type == TaskType.CLASSIFICATION:
        label = answer.get("label")
        if not isinstance(label, str) or label not in flow.labels:
            raise ReviewError("answer", f"Unknown label {label!r}; choose one of: {', '.join(flow.labels)}.")
        return {"label": label}
    text = answer.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ReviewError("answer", "A free-text answer needs a non-empty \"text\".")
    if len(text) > 100_000:
        raise ReviewError("answer", "At most 100,000 characters.")
    return {"text": text}


def answer_slot(assignment_id: int, user, answer: dict) -> Assignment:
    """Record the reviewer's answer; the answer that fills the last slot consolidates.
    An assignment whose lease ran out takes no answer (409), and its slot goes back."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            answered = _answer_in_postgres(assignment_id, user, answer)
            if answered is not None:
                return answered
        # Every other case (SQLite; on PostgreSQL anything but a held, live slot and a good
        # answer): the ORM path, which says precisely what is wrong, under the same lock.
        loop, assignment = _locked(assignment_id, user)
        now = timezone.now()
        conflict = _still_held(loop, assignment, now)
        if conflict is None:
            clean = check_answer(loop.flow_definition, answer)
            assignment.status = AssignmentStatus.ANSWERED
            assignment.answer = clean
            assignment.answered_at = now
            assignment.time_spent_seconds = max(0.0, (now - assignment.claimed_at).total_seconds())
            assignment.save(update_fields=["status", "answer", "answered_at", "time_spent_seconds"])
            loop.answers_count += 1
            loop.holds_count -= 1
            fields = ["answers_count", "holds_count"]
            if loop.answers_count >= loop.answers_needed:
                fields += _consolidate(loop, now)
            loop.save(update_fields=fields)
            if loop.status == LoopStatus.COMPLETED:
                completed = loop
                transaction.on_commit(lambda: _write_output_soon(completed.pk))
    if conflict:
        raise AssignmentConflict(conflict)
    assignment.loop = loop
    return assignment


# PostgreSQL, the answer in the common case (ARCHITECTURE: the lean path on hot endpoints),
# inside answer_slot's transaction: lock the loop (the lock every change to its
# assignments is made under), then in one statement — a fresh snapshot, so the assignment
# it reads is current — answer the assignment if it is still held and live, count the
# answer on the loop, and read the answers given before it (for the vote).
_ANSWER_LOCK_SQL = """
SELECT l.id, l.name, l.status, l.answers_needed, l.escalations, f.task_type, f.labels, f.work_team_id
FROM review_humanloop l JOIN review_flowdefinition f ON f.id = l.flow_definition_id
WHERE l.id = (SELECT a.loop_id FROM review_assignment a WHERE a.id = %(assignment)s AND a.worker_id = %(user)s)
FOR UPDATE OF l
"""
_ANSWER_SQL = """
WITH answered AS (
    UPDATE review_assignment
    SET status = 'answered', answer = %(answer)s, answered_at = %(now)s,
        time_spent_seconds = GREATEST(0, EXTRACT(EPOCH FROM %(now)s - claimed_at))::double precision
    WHERE id = %(assignment)s AND loop_id = %(loop)s AND status = 'held' AND lease_expires_at > %(now)s
    RETURNING claimed_at, lease_expires_at, time_spent_seconds
), counted AS (
    UPDATE review_humanloop SET answers_count = answers_count + 1, holds_count = holds_count - 1
    WHERE id = %(loop)s AND EXISTS (SELECT 1 FROM answered)
    RETURNING answers_count, holds_count, open_slots
)
SELECT answered.claimed_at, answered.lease_expires_at, answered.time_spent_seconds,
       counted.answers_count, counted.holds_count, counted.open_slots,
       ARRAY(SELECT a.answer ->> 'label' FROM review_assignment a
             WHERE a.loop_id = %(loop)s AND a.status = 'answered' AND a.id <> %(assignment)s)
FROM answered, counted
"""
_SOMEONE_LEFT_SQL = """
SELECT EXISTS (SELECT 1 FROM {members} m WHERE m.workteam_id = %(team)s AND NOT EXISTS (
    SELECT 1 FROM review_assignment a WHERE a.loop_id = %(loop)s AND a.worker_id = m.user_id
    AND a.status IN ('held', 'answered', 'released')))
"""


def _answer_in_postgres(assignment_id: int, user, answer: dict) -> Assignment | None:
    """The answer recorded (and the loop consolidated when it was the last one needed);
    None, with nothing changed, when the case is not the common one — unknown assignment,
    slot no longer held, lease run out, loop not in progress, a bad answer — which the ORM
    path then handles under the loop lock this already holds."""
    from psycopg.types.json import Jsonb

    with connection.cursor() as cursor:
        cursor.execute(_ANSWER_LOCK_SQL, {"assignment": assignment_id, "user": user.pk})
        row = cursor.fetchone()
        if row is None or row[2] != LoopStatus.IN_PROGRESS:
            return None
        loop_id, name, _status, answers_needed, escalations, task_type, labels, team_id = row
        flow = FlowDefinition(task_type=task_type, labels=json_column(labels))
        try:
            clean = check_answer(flow, answer)
        except ReviewError:
            return None  # the ORM path decides which error comes first (a 409 before a 400)
        now = timezone.now()
        cursor.execute(_ANSWER_SQL, {"answer": Jsonb(clean), "now": now, "assignment": assignment_id,
                                     "loop": loop_id})
        done = cursor.fetchone()
        if done is None:
            return None
        claimed_at, lease_expires_at, time_spent, answers_count, holds_count, open_slots, earlier = done
        loop = HumanLoop(pk=loop_id, name=name, status=LoopStatus.IN_PROGRESS, answers_needed=answers_needed,
                         answers_count=answers_count, holds_count=holds_count, open_slots=open_slots,
                         escalations=escalations)
        if answers_count >= answers_needed:
            _consolidate_in_postgres(cursor, loop, task_type, team_id, [*earlier, clean.get("label")], now)
    if loop.status == LoopStatus.COMPLETED:
        transaction.on_commit(lambda: _write_output_soon(loop_id))
    assignment = Assignment(pk=assignment_id, loop_id=loop_id, worker=user, status=AssignmentStatus.ANSWERED,
                            answer=clean, claimed_at=claimed_at, lease_expires_at=lease_expires_at,
                            answered_at=now, time_spent_seconds=time_spent)
    assignment.loop = loop
    return assignment


def _consolidate_in_postgres(cursor, loop: HumanLoop, task_type: str, team_id: int, labels: list, now: datetime) -> None:
    """_settle's rules (the loop row locked), written with one UPDATE."""
    def someone_left() -> bool:
        cursor.execute(_SOMEONE_LEFT_SQL.format(members=WorkTeam.members.through._meta.db_table),
                       {"team": team_id, "loop": loop.pk})
        return bool(cursor.fetchone()[0])

    fields = _settle(loop, task_type, [label for label in labels if isinstance(label, str)], someone_left, now)
    cursor.execute(f"UPDATE review_humanloop SET {', '.join(f'{field} = %s' for field in fields)} WHERE id = %s",
                   [*(getattr(loop, field) for field in fields), loop.pk])


def release_slot(assignment_id: int, user) -> Assignment:
    """The reviewer skips the item: the slot goes back, and they are not offered it again."""
    with transaction.atomic():
        loop, assignment = _locked(assignment_id, user)
        now = timezone.now()
        conflict = _still_held(loop, assignment, now)
        if conflict is None:
            _return_slot(loop, assignment, AssignmentStatus.RELEASED, now)
    if conflict:
        raise AssignmentConflict(conflict)
    assignment.loop = loop
    return assignment


# --- consolidation --------------------------------------------------------------------------
def vote(labels: Sequence[str]) -> tuple[Counter, str | None, bool]:
    """(votes, winner, tie): the majority label; a tie when the top two are equal."""
    votes = Counter(labels)
    ranked = votes.most_common()
    if not ranked:
        return votes, None, False
    tie = len(ranked) > 1 and ranked[0][1] == ranked[1][1]
    return votes, ranked[0][0], tie


def _consolidate(loop: HumanLoop, now: datetime) -> list[str]:
    """All needed answers are in (loop row locked): _settle with the answers read through
    the ORM. Returns the loop fields changed."""
    labels = [a["label"] for a in loop.assignments.filter(status=AssignmentStatus.ANSWERED)
              .values_list("answer", flat=True) if isinstance(a, dict) and "label" in a]
    return _settle(loop, loop.flow_definition.task_type, labels, lambda: _someone_left_to_ask(loop), now)


def _settle(loop: HumanLoop, task_type: str, labels: list[str], someone_left: Callable[[], bool],
            now: datetime) -> list[str]:
    """The consolidation rules, on the loop in memory: complete it (free text; a majority;
    a tie with no escalation left → no consensus), or escalate a tie by one more slot.
    Returns the loop fields changed, for the caller to write."""
    if task_type == TaskType.FREE_TEXT:
        loop.status = LoopStatus.COMPLETED
        loop.completed_at = now
        loop.consolidated_label = ""
        loop.agreement = None
        return ["status", "completed_at", "consolidated_label", "agreement"]
    votes, winner, tie = vote(labels)
    if tie and loop.escalations < MAX_ESCALATIONS and someone_left():
        loop.answers_needed += 1
        loop.open_slots += 1
        loop.escalations += 1
        return ["answers_needed", "open_slots", "escalations"]
    loop.status = LoopStatus.COMPLETED
    loop.completed_at = now
    loop.consolidated_label = NO_CONSENSUS if tie else (winner or NO_CONSENSUS)
    loop.agreement = (votes.most_common(1)[0][1] / len(labels)) if labels else None
    return ["status", "completed_at", "consolidated_label", "agreement"]


def _someone_left_to_ask(loop: HumanLoop) -> bool:
    """Whether a member of the flow's team has not yet held, answered or skipped this
    loop: without one, a tie-breaking slot could never be filled and the loop would only
    wait to expire, so it completes as no consensus instead."""
    asked = Assignment.objects.filter(loop=loop, status__in=LIVE_ASSIGNMENT_STATUSES).values("worker_id")
    return loop.flow_definition.work_team.members.exclude(pk__in=asked).exists()


# --- stopping and expiry --------------------------------------------------------------------
def _end_loop(loop: HumanLoop, status: str, now: datetime) -> None:
    """Finish an InProgress loop (row locked): held assignments expire, no slot stays open."""
    Assignment.objects.filter(loop=loop, status=AssignmentStatus.HELD).update(
        status=AssignmentStatus.EXPIRED, ended_at=now)
    loop.status = status
    loop.completed_at = now
    loop.open_slots = 0
    loop.holds_count = 0
    loop.save(update_fields=["status", "completed_at", "open_slots", "holds_count"])


def stop_loop(loop: HumanLoop, user=None) -> HumanLoop:
    """StopHumanLoop: an InProgress loop ends Stopped; answers already given are kept."""
    with transaction.atomic():
        locked = HumanLoop.objects.select_for_update().get(pk=loop.pk)
        if locked.status != LoopStatus.IN_PROGRESS:
            raise ReviewError("status", f"The human loop is {locked.status}; only InProgress loops can be stopped.",
                              status=409)
        _end_loop(locked, LoopStatus.STOPPED, timezone.now())
    return locked


def _lock_if_free(loop_id: int) -> HumanLoop | None:
    """The loop row locked, or None when another transaction holds it (skip, retry later)."""
    loops = HumanLoop.objects.filter(pk=loop_id)
    if connection.features.has_select_for_update_skip_locked:
        loops = loops.select_for_update(skip_locked=True)
    return loops.first()


def expire_leases(now: datetime | None = None, *, limit: int = EXPIRE_BATCH) -> int:
    """Held assignments past their lease give their slot back. Cheap when there are none
    (the partial index assignment_lease holds only held rows)."""
    now = now or timezone.now()
    # Every claim asks this first, nearly always to find none: plain SQL, no ORM compile.
    with connection.cursor() as cursor:
        # status spelled out: the partial index assignment_lease is on status = 'held'
        cursor.execute("SELECT id, loop_id FROM review_assignment WHERE status = 'held' AND lease_expires_at <= %s "
                       "ORDER BY lease_expires_at LIMIT %s", [now, limit])
        rows = cursor.fetchall()
    returned = 0
    for assignment_id, loop_id in rows:
        with transaction.atomic():
            loop = _lock_if_free(loop_id)
            if loop is None:
                continue
            assignment = Assignment.objects.select_for_update().get(pk=assignment_id)
            if assignment.status != AssignmentStatus.HELD or assignment.lease_expires_at > now:
                continue
            _return_slot(loop, assignment, AssignmentStatus.EXPIRED, now)
            returned += 1
    return returned


def expire_loops(now: datetime | None = None, *, limit: int = EXPIRE_BATCH) -> int:
    """InProgress loops past task_availability_seconds end Expired."""
    now = now or timezone.now()
    ids = list(HumanLoop.objects.filter(status=LoopStatus.IN_PROGRESS, expires_at__lte=now)
               .order_by("expires_at").values_list("pk", flat=True)[:limit])
    ended = 0
    for loop_id in ids:
        with transaction.atomic():
            loop = _lock_if_free(loop_id)
            if loop is None or loop.status != LoopStatus.IN_PROGRESS or loop.expires_at > now:
                continue
            _end_loop(loop, LoopStatus.EXPIRED, now)
            ended += 1
    return ended


def write_missing_outputs(now: datetime | None = None, *, limit: int = EXPIRE_BATCH) -> int:
    """Completed loops whose output JSON is not written (the store was down at commit)."""
    now = now or timezone.now()
    ids = list(HumanLoop.objects.filter(status=LoopStatus.COMPLETED, output_uri="",
                                        completed_at__lte=now - OUTPUT_RETRY_AFTER)
               .order_by("completed_at").values_list("pk", flat=True)[:limit])
    return sum(1 for loop_id in ids if write_output_safely(loop_id))


def expire_review_work(now: datetime | None = None) -> dict:
    """The beat's housekeeping: leases → slots back; loops past expires_at → Expired;
    unwritten outputs written."""
    now = now or timezone.now()
    return {"leases": expire_leases(now), "loops": expire_loops(now), "outputs": write_missing_outputs(now)}


# --- output JSON ----------------------------------------------------------------------------
def write_output(loop_id: int, loop: HumanLoop | None = None) -> str:
    """Write the loop's A2I-shaped output JSON and record its URI. `loop`: the instance
    just completed (with its flow and project), which saves reading it again."""
    from review.output import write_loop_output

    if loop is None:
        loop = HumanLoop.objects.select_related("flow_definition", "flow_definition__project").get(pk=loop_id)
    uri = write_loop_output(loop)
    HumanLoop.objects.filter(pk=loop_id).update(output_uri=uri)
    loop.output_uri = uri
    return uri


def _write_output_soon(loop_id: int) -> None:
    """Hand the output JSON to the control worker: an object-store write (a PUT to S3)
    does not belong in a reviewer's answer request. If the broker is unreachable the
    answer still stands; expire_review_work writes the output on a later tick."""
    from review.tasks import write_output_task

    try:
        write_output_task.delay(loop_id)
    except Exception:
        log.warning("could not enqueue the output of human loop %s; beat will write it", loop_id, exc_info=True)


def write_output_safely(loop_id: int, loop: HumanLoop | None = None) -> str | None:
    """write_output, logging instead of raising: the answers are in the database and
    expire_review_work retries."""
    try:
        return write_output(loop_id, loop)
    except Exception:
        log.warning("could not write the output of human loop %s; will retry", loop_id, exc_info=True)
        return None


# --- export and retrain ---------------------------------------------------------------------
def export_flow(flow: FlowDefinition, user, dataset_name: str | None = None, mode: str | None = None):
    """mode "merged" (the default when the loops came from a model's job): the next version
    of that job's training dataset with the reviewed records merged in; "reviewed_only":
    a dataset of the reviewed records alone (review.export)."""
    from review.export import export_flow as run_export

    return run_export(flow, user, dataset_name, mode)


def preview_export(flow: FlowDefinition, mode: str | None = None, dataset_name: str | None = None) -> dict:
    from review.export import preview_export as run_preview

    return run_preview(flow, mode, dataset_name)


def retrain_from_export(version, user):
    from review.export import retrain_from_export as run_retrain

    return run_retrain(version, user)


def claims_query_filter(user) -> Q:
    """Loops a reviewer may see: those of their teams' flows."""
    return Q(flow_definition__work_team__members=user)
