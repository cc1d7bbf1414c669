"""Thin Celery wrappers around tuning.engine (tests call the engine directly)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

log = logging.getLogger(__name__)


# Beat sends this every 2 s without an id (every active search); creating or stopping a
# search and a trial's end send it with one. Ticks that queued up while no control worker
# ran are worth nothing once a fresh one runs: the engine reads everything from the database.
@shared_task(name="tuning.tasks.advance_tuning_jobs_task", ignore_result=True, expires=10)
def advance_tuning_jobs_task(tuning_job_id: int | None = None) -> list[int]:
    from tuning.engine import advance, advance_all

    if tuning_job_id is None:
        return advance_all()
    advance(tuning_job_id)
    return [tuning_job_id]


def advance_when_trial_finished(sender: Any = None, job_id: int | None = None, **kwargs: Any) -> None:
    """jobs.transitions.job_finished receiver: a trial ended, so its search can settle it,
    ask for the next trial or end, without waiting for the periodic tick."""
    from jobs.models import TrainingJob
    from tuning.actions import advance_soon

    if job_id is None:
        return
    tuning_job_id = TrainingJob.objects.filter(pk=job_id).values_list("tuning_job_id", flat=True).first()
    if tuning_job_id is not None:
        advance_soon(tuning_job_id)
