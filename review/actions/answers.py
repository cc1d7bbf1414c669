"""Answers: a reviewer's answer to the slot they hold, and the loop's consolidation when
it was the last one needed (the rules themselves are review.consolidation).

Lock order: the loop row, then its assignment rows. Every answer is recorded under the
loop's row lock, so no answer is lost or counted twice and the vote sees them all."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from review import sql
from review.actions.claims import lock_assignment, still_held
from review.consolidation import consolidate
from review.errors import AssignmentConflict, ReviewError
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus, TaskType
from review.output import write_output_soon
from studio.models import json_column


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


def answer_slot(assignment_id: int, user: User, answer: dict) -> Assignment:
    """Record the reviewer's answer; the answer that fills the last slot consolidates.
    An assignment whose lease ran out takes no answer (409), and its slot goes back."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            answered = _answer_in_postgres(assignment_id, user, answer)
            if answered is not None:
                return answered
        # Every other case (SQLite; on PostgreSQL anything but a held, live slot and a good
        # answer): the ORM path, which says precisely what is wrong, under the same lock.
        loop, assignment = lock_assignment(assignment_id, user)
        now = timezone.now()
        conflict = still_held(loop, assignment, now)
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
                transaction.on_commit(lambda: write_output_soon(completed.pk))
    if conflict:
        raise AssignmentConflict(conflict)
    assignment.loop = loop
    return assignment


def _answer_in_postgres(assignment_id: int, user: User, answer: dict) -> Assignment | None:
    """The answer recorded in the common case (the lean path: the fewest
    statements on the hottest endpoint), with sql.ANSWER_LOCK then sql.ANSWER, and the loop consolidated when it
    was the last one needed; None, with nothing changed, when the case is not the common
    one — unknown assignment, slot no longer held, lease run out, loop not in progress, a
    bad answer — which the ORM path then handles under the loop lock this already holds."""
    from psycopg.types.json import Jsonb  # psycopg is there only with PostgreSQL

    with connection.cursor() as cursor:
        cursor.execute(sql.ANSWER_LOCK, {"assignment": assignment_id, "user": user.pk})
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
        # Any: psycopg adapts Jsonb, which django-stubs' list of parameter types leaves out.
        params: dict[str, Any] = {"answer": Jsonb(clean), "now": now, "assignment": assignment_id, "loop": loop_id}
        cursor.execute(sql.ANSWER, params)
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
        transaction.on_commit(lambda: write_output_soon(loop_id))
    assignment = Assignment(pk=assignment_id, loop_id=loop_id, worker=user, status=AssignmentStatus.ANSWERED,
                            answer=clean, claimed_at=claimed_at, lease_expires_at=lease_expires_at,
                            answered_at=now, time_spent_seconds=time_spent)
    assignment.loop = loop
    return assignment


def _consolidate_in_postgres(cursor, loop: HumanLoop, task_type: str, team_id: int, labels: list, now: datetime) -> None:
    """settle with the labels the answer statement read, written with one UPDATE."""
    def someone_left() -> bool:
        cursor.execute(sql.someone_left(), {"team": team_id, "loop": loop.pk})
        return bool(cursor.fetchone()[0])

    fields = settle(loop, task_type, [label for label in labels if isinstance(label, str)], someone_left, now)
    cursor.execute(sql.update_loop(fields), [*(getattr(loop, field) for field in fields), loop.pk])


def _consolidate(loop: HumanLoop, now: datetime) -> list[str]:
    """All needed answers are in (loop row locked): settle with the answers read through
    the ORM. Returns the loop fields changed."""
    labels = [a["label"] for a in loop.assignments.answered().values_list("answer", flat=True)
              if isinstance(a, dict) and "label" in a]
    return settle(loop, loop.flow_definition.task_type, labels, lambda: _someone_left_to_ask(loop), now)


def settle(loop: HumanLoop, task_type: str, labels: list[str], someone_left: Callable[[], bool],
           now: datetime) -> list[str]:
    """review.consolidation's outcome applied to the loop in memory: one more slot for a
    tie that escalates, else the loop completed with its label and agreement. Returns the
    loop fields changed, for the caller to write."""
    outcome = consolidate(labels, free_text=task_type == TaskType.FREE_TEXT, escalations=loop.escalations,
                          someone_left=someone_left)
    if outcome.escalate:
        loop.answers_needed += 1
        loop.open_slots += 1
        loop.escalations += 1
        return ["answers_needed", "open_slots", "escalations"]
    loop.status = LoopStatus.COMPLETED
    loop.completed_at = now
    loop.consolidated_label = outcome.label
    loop.agreement = outcome.agreement
    return ["status", "completed_at", "consolidated_label", "agreement"]


def _someone_left_to_ask(loop: HumanLoop) -> bool:
    """Whether a member of the flow's team has not yet held, answered or skipped this
    loop: without one, a tie-breaking slot could never be filled and the loop would only
    wait to expire, so it completes as no consensus instead."""
    asked = Assignment.objects.filter(loop=loop).live().values("worker_id")
    return loop.flow_definition.work_team.members.exclude(pk__in=asked).exists()
