"""The beat's housekeeping (and the start of every claim): leases that ran out give their
slots back, loops past their availability end Expired, outputs the store refused are
written again. Each item is its own transaction; a loop another transaction holds is
skipped and retried on a later tick, so the beat never waits on a reviewer.

Lock order: the loop row, then its assignment rows."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from review import sql
from review.actions.loops import end_loop, return_slot
from review.models import Assignment, AssignmentStatus, HumanLoop, LoopStatus
from review.output import write_output_safely

EXPIRE_BATCH = 200  # leases/loops handled per beat step, so one tick stays short
OUTPUT_RETRY_AFTER = timedelta(seconds=10)  # leave a fresh completion to its own write task


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
        cursor.execute(sql.LEASES_RUN_OUT, [now, limit])
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
            return_slot(loop, assignment, AssignmentStatus.EXPIRED, now)
            returned += 1
    return returned


def expire_loops(now: datetime | None = None, *, limit: int = EXPIRE_BATCH) -> int:
    """InProgress loops past task_availability_seconds end Expired."""
    now = now or timezone.now()
    ids = list(HumanLoop.objects.past_availability(now).values_list("pk", flat=True)[:limit])
    ended = 0
    for loop_id in ids:
        with transaction.atomic():
            loop = _lock_if_free(loop_id)
            if loop is None or loop.status != LoopStatus.IN_PROGRESS or loop.expires_at > now:
                continue
            end_loop(loop, LoopStatus.EXPIRED, now)
            ended += 1
    return ended


def write_missing_outputs(now: datetime | None = None, *, limit: int = EXPIRE_BATCH) -> int:
    """Completed loops whose output JSON is not written (the store was down at commit)."""
    now = now or timezone.now()
    ids = list(HumanLoop.objects.output_missing(now - OUTPUT_RETRY_AFTER).values_list("pk", flat=True)[:limit])
    return sum(1 for loop_id in ids if write_output_safely(loop_id))


def expire_review_work(now: datetime | None = None) -> dict:
    """The beat's housekeeping: leases → slots back; loops past expires_at → Expired;
    unwritten outputs written."""
    now = now or timezone.now()
    return {"leases": expire_leases(now), "loops": expire_loops(now), "outputs": write_missing_outputs(now)}
