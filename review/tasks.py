"""Review's periodic work (beat runs it every 2 s): a thin wrapper, the logic is in review.actions."""

from __future__ import annotations

from celery import shared_task

from review import actions


@shared_task(name="review.tasks.expire_review_work_task", ignore_result=True)
def expire_review_work_task() -> dict:
    return actions.expire_review_work()
