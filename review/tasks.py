"""Review's Celery tasks (beat runs expire_review_work_task every 2 s): thin wrappers, the logic is in review.actions.expiry and review.output."""

from __future__ import annotations

from celery import shared_task

from review.actions.expiry import expire_review_work
from review.output import write_output_safely


@shared_task(name="review.tasks.expire_review_work_task", ignore_result=True)
def expire_review_work_task() -> dict:
    return expire_review_work()


# Sent on commit by the answer that completes a loop. expires: past it, beat's
# expire_review_work writes whatever is still missing.
@shared_task(name="review.tasks.write_output_task", ignore_result=True, expires=300)
def write_output_task(loop_id: int) -> str | None:
    return write_output_safely(loop_id)
