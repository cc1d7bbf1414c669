"""Warm pools (keep_alive_seconds, docs/SPEC.md §3.6): a job's node stays reserved after it ends,
holding a fork server with torch imported; the next matching job starts there."""

from __future__ import annotations

import re
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from datasets.storage import store_for
from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from tests.cluster import HEARTBEAT_SECONDS, wait_job
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def _run(cluster, job: TrainingJob, timeout: float = 90) -> TrainingJob:
    job = wait_job(cluster, job, timeout=timeout)
    assert job.status == JobStatus.COMPLETED, job.failure_reason
    return job


def _starter(job: TrainingJob) -> tuple[int, str, bool]:
    uri = f"{job.output_uri}/logs/rank-0.log"
    with store_for(uri).open_read(uri) as source:
        text = source.read().decode(errors="replace")
    match = re.search(r"started-by pid=(\d+) cmd=(.*) torch-preloaded=(\w+)", text)
    assert match, text
    return int(match.group(1)), match.group(2), match.group(3) == "True"


def _node_of(job: TrainingJob) -> Node:
    return JobAttempt.objects.get(job=job, attempt=job.attempt).node


def test_the_next_matching_job_reuses_the_pools_node_and_process(cluster, submit):
    first = _run(cluster, submit("whoami.py", keep_alive_seconds=120))
    node = _node_of(first)
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.WARM).exists(), timeout=15,
             message="the node to turn warm")
    node.refresh_from_db()
    assert node.warm_pool == f"pool-{first.pk}"
    assert node.warm_until > timezone.now() + timedelta(seconds=100)
    cold_starter, cold_cmd, cold_torch = _starter(first)
    assert "worker" in cold_cmd and not cold_torch, "the first job started cold, through torch.distributed.run"
    assert first.warm_pool == ""

    second = _run(cluster, submit("whoami.py", keep_alive_seconds=120))
    third = _run(cluster, submit("whoami.py", keep_alive_seconds=120))

    for job in (second, third):
        assert job.warm_pool == f"pool-{first.pk}"
        assert _node_of(job).pk == node.pk
        assert JobAttempt.objects.get(job=job).warm_start
    pid_2, cmd_2, torch_2 = _starter(second)
    pid_3, _, _ = _starter(third)
    assert "jobs.runner.process.forkserver" in cmd_2 and torch_2, "forked from the pool's server, torch already imported"
    assert pid_2 == pid_3, "both jobs came from the same pre-started process"
    assert psutil.Process(pid_2).ppid() == cluster.node(node.name).process.pid

    # A job of another shape (2 nodes) does not take the pool; when the pool expires its
    # node is free again and its fork server goes away.
    Node.objects.filter(pk=node.pk).update(warm_until=timezone.now() - timedelta(seconds=1))
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.IDLE, warm_pool="").exists(), timeout=15,
             message="the expired pool to free its node")
    wait_for(lambda: not psutil.pid_exists(pid_2) or psutil.Process(pid_2).status() == psutil.STATUS_ZOMBIE,
             timeout=10 * HEARTBEAT_SECONDS, message="the fork server to close")
