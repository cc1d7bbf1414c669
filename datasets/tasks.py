from __future__ import annotations

from celery import shared_task

from datasets.validation_run import requeue_stalled_validations, run_validation


@shared_task(name="datasets.tasks.validate_version_task", acks_late=True)
def validate_version_task(version_id: int) -> None:
    run_validation(version_id)


@shared_task(name="datasets.tasks.requeue_stalled_validations_task")
def requeue_stalled_validations_task() -> None:
    requeue_stalled_validations()
