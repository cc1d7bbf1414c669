"""Claims: a reviewer holds the next slot they may answer, for the flow's
task_time_limit_seconds, or gives it back (a skip).

Lock order: the loop row, then its assignment rows. A claim moves one slot from open to
held with a compare-and-set (open_slots > 0), so no slot is ever held twice; the unique
constraint one_live_assignment_per_reviewer keeps a reviewer from holding a loop twice."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from review import sql
from review.actions.expiry import expire_leases
from review.actions.loops import return_slot
from review.errors import AssignmentConflict, ReviewError
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus
from studio.models import json_column

CLAIM_CANDIDATES = 8  # how many loops one claim tries before giving up (lost races on SQLite)
CLAIM_EXPIRY_BATCH = 20  # expired leases a claim returns before it looks (beat does the rest)


def reviewable_flows(user: User, flow_id: int | None = None) -> list[FlowDefinition]:
    """The flows whose items the user may claim, by id ([] or [that flow] with flow_id).
    Partial instances: the fields claims and claim_json read, never saved. Plain SQL, read
    once per claim."""
    with connection.cursor() as cursor:
        cursor.execute(sql.reviewable_flows(flow_id is not None), [flow_id, user.pk] if flow_id is not None else [user.pk])
        rows = cursor.fetchall()
    return [FlowDefinition(id=pk, name=name, title=title, task_type=task_type, labels=json_column(labels),
                           instructions_html=instructions_html, show_prediction=bool(show_prediction),
                           task_time_limit_seconds=lease_seconds, order=order)
            for pk, name, title, task_type, labels, instructions_html, show_prediction, lease_seconds, order in rows]


def claim_next_slot(user: User, flow: FlowDefinition | int | None = None) -> Assignment | None:
    """Hold the next slot the user may answer, for the flow's task_time_limit_seconds;
    None when there is nothing for them (or the flow is not theirs to review). Without a
    flow: the user's teams' flows in turn (by id), each in its own order."""
    flow_id = flow.pk if isinstance(flow, FlowDefinition) else flow
    return claim_in_flows(user, reviewable_flows(user, flow_id))


def claim_in_flows(user: User, flows: Sequence[FlowDefinition]) -> Assignment | None:
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


def claim_statement(user: User, flow_id: int, order: str, lease_seconds: int, now: datetime) -> tuple[str, dict]:
    """The PostgreSQL claim as (sql, params); bench/review.py explains it."""
    return sql.claim(order), {"flow": flow_id, "user": user.pk, "now": now,
                              "lease": now + timedelta(seconds=lease_seconds)}


def _claim_in(user: User, flow: FlowDefinition, now: datetime) -> Assignment | None:
    """A claim within one flow the user may review. PostgreSQL: one statement (review.sql
    locks the candidate with SKIP LOCKED). Elsewhere (SQLite) rows are not locked, so a
    few candidates are tried, each in a savepoint, and the compare-and-set plus the unique
    constraint keep one slot to one reviewer."""
    if connection.features.has_select_for_update_skip_locked:
        return _claim_in_postgres(user, flow, now)
    with transaction.atomic():
        candidates = (HumanLoop.objects.filter(flow_definition_id=flow.pk).claimable_by(user, now)
                      .in_claim_order(flow.order).values_list("id", flat=True)[:CLAIM_CANDIDATES])
        for loop_id in list(candidates):
            assignment = _take_slot(loop_id, user, flow.task_time_limit_seconds, now)
            if assignment is not None:
                assignment.loop = HumanLoop.objects.only("name", "flow_definition_id", "status", "input_content",
                                                         "prediction").get(pk=loop_id)
                return assignment
    return None


def _claim_in_postgres(user: User, flow: FlowDefinition, now: datetime) -> Assignment | None:
    statement, params = claim_statement(user, flow.pk, flow.order, flow.task_time_limit_seconds, now)
    for _attempt in range(CLAIM_CANDIDATES):
        try:
            # One statement, atomic by itself (no BEGIN/COMMIT round trips); inside a
            # caller's transaction, a savepoint so a lost race does not poison it.
            guard = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
            with guard, connection.cursor() as cursor:
                cursor.execute(statement, params)
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


def _move_slot(loop_id: int) -> bool:
    """Compare-and-set: one slot of the loop from open to held, if one is still open."""
    return bool(HumanLoop.objects.filter(pk=loop_id, status=LoopStatus.IN_PROGRESS, open_slots__gt=0)
                .update(open_slots=F("open_slots") - 1, holds_count=F("holds_count") + 1))


def _hold(loop_id: int, user: User, lease_seconds: int, now: datetime) -> Assignment:
    return Assignment.objects.create(loop_id=loop_id, worker=user, status=AssignmentStatus.HELD, claimed_at=now,
                                     lease_expires_at=now + timedelta(seconds=lease_seconds))


def _take_slot(loop_id: int, user: User, lease_seconds: int, now: datetime) -> Assignment | None:
    """Move one slot of the loop from open to held and record the hold; None if the slot
    went to someone else first (or the user got this loop in another session)."""
    try:
        with transaction.atomic():  # a savepoint: a lost race undoes only this attempt
            if not _move_slot(loop_id):
                return None
            return _hold(loop_id, user, lease_seconds, now)
    except IntegrityError:
        return None


def lock_assignment(assignment_id: int, user: User) -> tuple[HumanLoop, Assignment]:
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


def still_held(loop: HumanLoop, assignment: Assignment, now: datetime) -> str | None:
    """None when the reviewer still holds the slot; else why not (for a 409). A lease
    found run out here gives its slot back on the spot (loop row locked)."""
    if assignment.status != AssignmentStatus.HELD or loop.status != LoopStatus.IN_PROGRESS:
        return _not_answerable(loop, assignment)
    if assignment.lease_expires_at <= now:
        return_slot(loop, assignment, AssignmentStatus.EXPIRED, now)
        return "The assignment's lease expired; its slot went back to the queue."
    return None


def release_slot(assignment_id: int, user: User) -> Assignment:
    """The reviewer skips the item: the slot goes back, and they are not offered it again."""
    with transaction.atomic():
        loop, assignment = lock_assignment(assignment_id, user)
        now = timezone.now()
        conflict = still_held(loop, assignment, now)
        if conflict is None:
            return_slot(loop, assignment, AssignmentStatus.RELEASED, now)
    if conflict:
        raise AssignmentConflict(conflict)
    assignment.loop = loop
    return assignment
