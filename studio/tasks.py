"""Thin Celery wrappers around studio.deletion and studio.notify (tests call those functions directly)."""

from __future__ import annotations

from celery import shared_task


# Sent on commit by every delete. acks_late (the default here): a worker killed midway gets
# the message back; the intent's shrinking URI list makes a rerun finish only what is left.
@shared_task(name="studio.tasks.delete_objects_task", ignore_result=True)
def delete_objects_task(pending_id: int) -> int:
    from studio.deletion import run_deletion

    return run_deletion(pending_id)


# Beat sends this every 60 s: it finishes deletions whose worker died or whose message was lost.
@shared_task(name="studio.tasks.sweep_pending_deletions_task", ignore_result=True, expires=50)
def sweep_pending_deletions_task(stale_after_seconds: int | None = None) -> list[int]:
    from studio.deletion import STALE_AFTER_SECONDS, sweep_pending_deletions

    return sweep_pending_deletions(STALE_AFTER_SECONDS if stale_after_seconds is None else stale_after_seconds)


# Sent on commit by studio.notify.notify (and a channel's test): one try of one delivery.
@shared_task(name="studio.tasks.deliver_task", ignore_result=True)
def deliver_task(delivery_id: int) -> str:
    from studio.notify import deliver

    return deliver(delivery_id)


# Beat sends this every 5 s: due retries, and deliveries whose task message was lost. expires:
# a sweep that waited in the queue past the next one is dropped, not run twice over.
@shared_task(name="studio.tasks.retry_deliveries_task", ignore_result=True, expires=4)
def retry_deliveries_task() -> int:
    from studio.notify import retry_due

    return retry_due()
