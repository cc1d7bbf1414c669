"""Status changes of training jobs: compare-and-set, recorded in the timeline, announced
on the job's event stream for live pages. Every writer (actions, scheduler, node agent)
goes through `transition`, so the timeline can never miss a change."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from jobs.models import FINISHED_STATUSES, JobEvent, JobStatus, TrainingJob
from trainyard.protocol import EVENT_STREAM_MAXLEN, EVENTS_STREAM, key

log = logging.getLogger(__name__)

# Sent after the commit that finished a job (Completed, Stopped or Failed), with `job_id`:
# a hyperparameter search reacts to its trial's end at once (tuning.apps) instead of at
# its next periodic tick.
job_finished = Signal()


def transition(job_id: int, to_status: str, *, from_statuses: Iterable[str] | None = None, message: str = "",
               **fields) -> bool:
    """Move the job to `to_status` if its status is one of `from_statuses` (default: any
    unfinished status). Returns False, changing nothing, when someone else moved it first.
    `fields` are written in the same UPDATE (failure_reason, finished_at, ...)."""
    allowed = list(from_statuses) if from_statuses is not None else [s for s in JobStatus.values if s not in FINISHED_STATUSES]
    now = timezone.now()
    updates = {"status": to_status, **fields}
    if to_status in FINISHED_STATUSES:
        updates.setdefault("finished_at", now)
        updates.setdefault("lease_expires_at", None)
        updates.setdefault("waiting_reason", "")  # a finished job waits for nothing (a stopped Pending one said it did)
    with transaction.atomic():
        changed = TrainingJob.objects.filter(pk=job_id, status__in=allowed).update(**updates)
        if not changed:
            return False
        attempt = TrainingJob.objects.filter(pk=job_id).values_list("attempt", flat=True).first() or 0
        JobEvent.objects.create(job_id=job_id, status=to_status, at=now, message=message, attempt=attempt)
    transaction.on_commit(lambda: announce(job_id, to_status, now.isoformat(), message))
    if to_status in FINISHED_STATUSES:
        transaction.on_commit(lambda: _announce_finished(job_id))
    return True


def _announce_finished(job_id: int) -> None:
    try:
        job_finished.send(sender=TrainingJob, job_id=job_id)
    except Exception:  # noqa: BLE001 - a listener's trouble must not fail a status change
        log.warning("a job_finished listener failed for job %s", job_id, exc_info=True)


def note(job_id: int, message: str) -> None:
    """A timeline entry that does not change the status (e.g. "restored checkpoint step 40")."""
    status, attempt = TrainingJob.objects.filter(pk=job_id).values_list("status", "attempt").get()
    now = timezone.now()
    JobEvent.objects.create(job_id=job_id, status=status, at=now, message=message, attempt=attempt)
    transaction.on_commit(lambda: announce(job_id, status, now.isoformat(), message))


def announce(job_id: int, status: str, at: str, message: str) -> None:
    """Best effort: the database is the record; the stream only makes pages live."""
    from studio.redis_conn import redis_client

    try:
        redis_client().xadd(key(EVENTS_STREAM, job_id), {"status": status, "at": at, "message": message},
                            maxlen=EVENT_STREAM_MAXLEN, approximate=True)
    except Exception:  # noqa: BLE001 - Redis down must not fail a status change
        log.warning("could not announce job %s -> %s on Redis", job_id, status, exc_info=True)


def timeline(job: TrainingJob) -> list[dict]:
    return [{"status": e.status, "at": e.at, "message": e.message, "attempt": e.attempt} for e in job.events.all()]
