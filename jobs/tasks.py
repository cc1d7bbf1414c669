"""Thin Celery wrappers around plain functions in jobs/ (tests call those directly)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_shutting_down

from jobs.nodes import mark_lost_nodes


# Beat sends this every 2 s. `expires` drops sweeps that queued up while no control
# worker was running: one fresh sweep does the work of all of them.
@shared_task(name="jobs.tasks.mark_lost_nodes_task", ignore_result=True, expires=30)
def mark_lost_nodes_task() -> int:
    return mark_lost_nodes()


# Beat sends this every 2 s, submit_job on commit, an agent when it frees its node: ticks
# that queued up while no control worker ran are worth nothing once a fresh one runs.
@shared_task(name="jobs.tasks.schedule_jobs_task", ignore_result=True, expires=10)
def schedule_jobs_task() -> list[int]:
    from jobs.scheduling import schedule_jobs

    return schedule_jobs()


# Sent by the scheduler to one node's own queue (apply_async(queue=node.queue)). acks_late:
# a worker killed mid-job gets the message back when it restarts, and run_node finds its
# attempt claimed and leaves — the job's owner is the database (claim + lease), not the
# broker, so a redelivery (or the visibility timeout on a days-long run) never runs it twice.
@shared_task(name="jobs.tasks.run_node_task", ignore_result=True, acks_late=True)
def run_node_task(job_id: int, attempt: int, node_rank: int) -> str:
    from jobs.runner.agent import run_node

    return run_node(job_id, attempt, node_rank)


# Beat sends this every STUDIO_CLUSTER_SAMPLE_SECONDS (15 s): a sample that waited in the
# queue past the next one's time is worth nothing, and one stamped late would misplace it.
@shared_task(name="jobs.tasks.sample_cluster_task", ignore_result=True, expires=10)
def sample_cluster_task() -> int:
    from jobs.cluster import sample_cluster

    return sample_cluster().pk


@worker_shutting_down.connect
def _end_running_job_on_shutdown(sig: Any = None, how: Any = None, exitcode: Any = None, **kwargs: Any) -> None:
    """A node worker asked to stop (SIGTERM, Ctrl-C) ends its job's processes (SIGTERM,
    grace, SIGKILL) and records why, instead of leaving them running without an agent.
    Runs inside the signal handler: it only sets a flag the agent's loop reads."""
    from jobs.runner.agent import SHUTDOWN

    SHUTDOWN.set()
