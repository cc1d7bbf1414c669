"""Thin Celery wrappers around studio.deletion (tests call those functions directly)."""

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
