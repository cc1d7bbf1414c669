"""Thin Celery wrappers around evaluations.run and evaluations.actions (tests call those directly)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="evaluations.tasks.run_evaluation_task", ignore_result=True)
def run_evaluation_task(evaluation_id: int) -> str:
    from evaluations.run import run_evaluation

    return run_evaluation(evaluation_id)


# Beat sends this every 30 s; a tick that waited in the queue is worth nothing later.
@shared_task(name="evaluations.tasks.requeue_stalled_evaluations_task", ignore_result=True, expires=25)
def requeue_stalled_evaluations_task() -> list[int]:
    from evaluations.actions import requeue_stalled_evaluations

    return requeue_stalled_evaluations()
