"""Parts of a running studio die mid-job and nothing is lost (docs/SPEC.md §3.6):

- kill -9 of a node worker and its job processes → the attempt is marked lost, the job
  retries on a live node from its last checkpoint and completes, one point per step;
- Redis killed and restarted mid-job → the job completes and every metric point arrives;
- the control worker killed and restarted → scheduling goes on.
"""

from __future__ import annotations

import re

import pytest

from datasets.storage import store_for
from jobs.models import FINISHED_STATUSES, JobAttempt, JobStatus, MetricPoint, TrainingJob
from tests.cluster import LOST_SECONDS, wait_job
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def _wait(cluster, job: TrainingJob, *statuses: str, timeout: float = 90) -> TrainingJob:
    return wait_job(cluster, job, statuses=statuses, timeout=timeout)


def _points(job: TrainingJob, name: str = "loss") -> list[int]:
    return list(MetricPoint.objects.filter(job=job, name=name).order_by("step").values_list("step", flat=True))


def _stored_checkpoints(job: TrainingJob) -> list[str]:
    uri = job.checkpoint["uri"]
    try:
        return [entry for entry in store_for(uri).list(uri)]
    except Exception:  # noqa: BLE001 - not there yet
        return []


def _log(job: TrainingJob, name: str) -> str:
    uri = f"{job.output_uri}/logs/{name}"
    with store_for(uri).open_read(uri) as source:
        return source.read().decode(errors="replace")


def test_a_killed_node_costs_an_attempt_not_the_job(cluster, submit):
    job = submit("resumable.py", hyperparameters={"steps": 40, "every": 5, "delay": 0.2}, retries=1)
    job.checkpoint = {"uri": f"{job.output_uri}/checkpoints"}
    job.save(update_fields=["checkpoint"])
    _wait(cluster, job, JobStatus.TRAINING)
    # Past a few checkpoints, and at least one of them synced to the store.
    wait_for(lambda: len(_points(job)) >= 12 and _stored_checkpoints(job), timeout=60, message="checkpoints to sync")
    first = JobAttempt.objects.get(job=job, attempt=1)
    victim = cluster.node(first.node.name)

    cluster.kill(victim)  # the worker and every process below it: the launcher and the script

    # Marked lost within the lost-node limit (plus the sweep's 2 s tick), then back to Pending.
    wait_for(lambda: JobAttempt.objects.filter(pk=first.pk, outcome="lost").exists(), timeout=LOST_SECONDS + 10,
             message="the attempt to be marked lost")
    job = _wait(cluster, job, *FINISHED_STATUSES, timeout=120)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert job.attempt == 2
    second = JobAttempt.objects.get(job=job, attempt=2)
    assert second.node.name != victim.name, "the retry ran on a live node"
    messages = list(job.events.values_list("status", "message"))
    assert any(status == JobStatus.PENDING and "was lost" in message and "retrying" in message
               for status, message in messages), messages
    # Resumed from a checkpoint: its first step is just past the checkpoint it restored.
    log = _log(job, "rank-0.log")
    resumed = re.search(r"resumed from checkpoint step (\d+)", log)
    assert resumed, log
    checkpoint_step = int(resumed.group(1))
    assert checkpoint_step >= 5
    assert f"first step {checkpoint_step + 1} attempt 2" in log
    # Every step once: the re-run steps replaced their first points.
    wait_for(lambda: len(_points(job)) == 40, timeout=30, message="all 40 points")
    assert _points(job) == list(range(1, 41))


def test_a_node_lost_with_no_retries_fails_the_job_saying_why(cluster, submit):
    job = submit("resumable.py", hyperparameters={"steps": 200, "delay": 0.1}, retries=0)
    _wait(cluster, job, JobStatus.TRAINING)
    node = JobAttempt.objects.get(job=job, attempt=1).node.name
    cluster.kill(cluster.node(node))

    job = _wait(cluster, job, *FINISHED_STATUSES, timeout=LOST_SECONDS + 30)

    assert job.status == JobStatus.FAILED
    assert f"node {node} was lost" in job.failure_reason
    assert "no retries were asked for" in job.failure_reason


def test_redis_restarted_mid_job_loses_no_metric_point(cluster, submit):
    job = submit("resumable.py", hyperparameters={"steps": 30, "every": 100, "delay": 0.2})
    _wait(cluster, job, JobStatus.TRAINING)
    wait_for(lambda: len(_points(job)) >= 5, timeout=30, message="the first points")

    cluster.restart_redis(down_seconds=2)

    job = _wait(cluster, job, *FINISHED_STATUSES, timeout=120)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    wait_for(lambda: len(_points(job)) == 30, timeout=30, message="all 30 points after the restart")
    assert _points(job) == list(range(1, 31))


def test_scheduling_goes_on_after_the_control_worker_restarts(cluster, submit):
    cluster.kill(cluster.control)
    job = submit("resumable.py", hyperparameters={"steps": 3, "delay": 0})
    cluster.start(cluster.control)

    job = _wait(cluster, job, *FINISHED_STATUSES, timeout=90)
    assert job.status == JobStatus.COMPLETED, job.failure_reason


def test_a_killed_node_of_a_two_node_gang_retries_the_whole_gang(cluster, submit):
    job = submit("resumable_ddp.py", instance_count=2, distribution="ddp", retries=2,
                 hyperparameters={"steps": 40, "every": 5, "delay": 0.2})
    job.checkpoint = {"uri": f"{job.output_uri}/checkpoints"}
    job.save(update_fields=["checkpoint"])
    _wait(cluster, job, JobStatus.TRAINING)
    wait_for(lambda: len(_points(job)) >= 12 and _stored_checkpoints(job), timeout=60, message="checkpoints to sync")
    # Kill node 1: node 0's rank fails on its next all-reduce, long before the lost-node
    # sweep; its agent sees the peer silent and ends the attempt as lost, not failed.
    victim = JobAttempt.objects.get(job=job, attempt=1, node_rank=1).node.name
    cluster.kill(cluster.node(victim))

    job = _wait(cluster, job, *FINISHED_STATUSES, timeout=150)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert job.attempt == 2
    assert victim not in set(JobAttempt.objects.filter(job=job, attempt=2).values_list("node__name", flat=True))
    log = _log(job, "rank-0.log")
    checkpoint_step = int(re.search(r"resumed from checkpoint step (\d+)", log).group(1))
    assert checkpoint_step >= 5
    wait_for(lambda: len(_points(job)) == 40, timeout=30, message="all 40 points")
    assert _points(job) == list(range(1, 41))
