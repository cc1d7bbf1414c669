"""Thin Celery wrappers around hosting.batch and hosting.actions (tests call those directly)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="hosting.tasks.run_batch_prediction_task", ignore_result=True)
def run_batch_prediction_task(batch_id: int) -> str:
    from hosting.batch import run_batch_prediction

    return run_batch_prediction(batch_id)


# Beat sends this every 30 s; a tick that waited in the queue is worth nothing later.
@shared_task(name="hosting.tasks.requeue_stalled_batch_predictions_task", ignore_result=True, expires=25)
def requeue_stalled_batch_predictions_task() -> list[int]:
    from hosting.actions import requeue_stalled_batches

    return requeue_stalled_batches()
