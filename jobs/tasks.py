"""Thin Celery wrappers around plain functions in jobs/ (tests call those directly)."""

from __future__ import annotations

from celery import shared_task

from jobs.nodes import mark_lost_nodes


# Beat sends this every 10 s. `expires` drops sweeps that queued up while no control
# worker was running: one fresh sweep does the work of all of them.
@shared_task(name="jobs.tasks.mark_lost_nodes_task", ignore_result=True, expires=30)
def mark_lost_nodes_task() -> int:
    return mark_lost_nodes()
