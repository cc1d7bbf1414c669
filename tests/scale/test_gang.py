"""Gang scheduling and multi-node DDP on three simulated nodes (docs/SPEC.md §3.6)."""

from __future__ import annotations

import pytest

from datasets.storage import store_for
from jobs.models import JobAttempt, JobStatus, TrainingJob
from tests.cluster import wait_job
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def _finish(cluster, *jobs: TrainingJob, timeout: float = 150) -> None:
    wait_job(cluster, *jobs, timeout=timeout)


def _text(uri: str) -> str:
    with store_for(uri).open_read(uri) as source:
        return source.read().decode(errors="replace")


def test_two_two_node_jobs_on_three_nodes_run_one_after_the_other(cluster, submit):
    first = submit("resumable.py", instance_count=2, distribution="ddp", hyperparameters={"steps": 8, "delay": 0.2})
    second = submit("resumable.py", instance_count=2, distribution="ddp", hyperparameters={"steps": 8, "delay": 0.2})

    # While the first holds two of the three nodes, the second waits whole: no half gang.
    wait_for(lambda: TrainingJob.objects.filter(pk=first.pk, status=JobStatus.TRAINING).exists(), timeout=60,
             message="the first job to train")
    second.refresh_from_db()
    assert second.status == JobStatus.PENDING
    wait_for(lambda: TrainingJob.objects.get(pk=second.pk).waiting_reason, timeout=10, message="a waiting reason")
    assert "waiting for 2 sim nodes" in TrainingJob.objects.get(pk=second.pk).waiting_reason
    assert not JobAttempt.objects.filter(job=second).exists(), "no node is reserved for a job that cannot start"

    _finish(cluster, first, second)

    assert (first.status, second.status) == (JobStatus.COMPLETED, JobStatus.COMPLETED), (
        first.failure_reason, second.failure_reason)
    a = list(JobAttempt.objects.filter(job=first))
    b = list(JobAttempt.objects.filter(job=second))
    assert len(a) == len(b) == 2
    # One job at a time per node: the second gang took the first's nodes only once they were done.
    first_on = {x.node_id: x for x in a}
    shared = [x for x in b if x.node_id in first_on]
    assert shared, "two 2-node gangs on three nodes share at least one node"
    for x in shared:
        assert first_on[x.node_id].finished_at <= x.started_at
    timeline = [(x.job_id, x.node.name, x.started_at.time(), x.finished_at.time()) for x in a + b]
    assert min(x.started_at for x in b) >= min(x.finished_at for x in a), timeline


def test_a_job_asking_for_more_nodes_than_registered_says_why(cluster, submit):
    job = submit("resumable.py", instance_count=4, distribution="ddp", hyperparameters={"steps": 1})
    wait_for(lambda: TrainingJob.objects.get(pk=job.pk).waiting_reason, timeout=20, message="a waiting reason")
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING
    assert job.waiting_reason.startswith("waiting for 4 sim nodes;")
    assert "3 registered" in job.waiting_reason


def test_a_two_node_ddp_job_sees_world_size_two_and_its_own_host(cluster, submit):
    job = submit("ddp_world.py", instance_count=2, distribution="ddp")
    _finish(cluster, job)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    hosts = list(JobAttempt.objects.filter(job=job).order_by("node_rank").values_list("node__name", flat=True))
    assert len(set(hosts)) == 2
    for rank in (0, 1):
        assert f"WORLD_SIZE=2 RANK={rank} sum=2 SM_CURRENT_HOST={hosts[rank]}" in _text(
            f"{job.output_uri}/logs/rank-{rank}.log")
