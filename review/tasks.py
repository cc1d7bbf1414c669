"""Review's periodic work (beat runs it every 2 s): a thin wrapper, the logic is in review.actions."""

from __future__ import annotations

from celery import shared_task

from review import actions


@shared_task(name="review.tasks.expire_review_work_task", ignore_result=True)
def expire_review_work_task() -> dict:
    return actions.expire_review_work()


# Sent on commit by the answer that completes a loop. expires: past it, beat's
# expire_review_work writes whatever is still missing.
@shared_task(name="review.tasks.write_output_task", ignore_result=True, expires=300)
def write_output_task(loop_id: int) -> str | None:
    return actions.write_output_safely(loop_id)
