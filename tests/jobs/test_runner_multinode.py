"""Two node workers on one machine run one job together (static rendezvous on node 0,
its address shared through Redis): the launch path the next issue scales out."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from jobs.models import JobAttempt, JobStatus, Node
from jobs.nodes import register_node
from tests.conftest import wait_for
from tests.jobs.conftest import NodeWorker, node_env, run_to_end, start_worker, stop_worker, stored_text
from tests.jobs.test_runner import _members

pytestmark = pytest.mark.slow


@pytest.fixture
def second_node(node, node_worker: NodeWorker, isolated_storage, tmp_path) -> Iterator[Node]:
    # Same data directory: simulated nodes on one machine share the dataset cache.
    worker = start_worker(f"test-node2-{uuid.uuid4().hex[:6]}", node_env(isolated_storage, node_worker.data_dir),
                          tmp_path / "second-worker.log")
    try:
        yield register_node(name=worker.name, instance_type="cpu", pid=worker.process.pid)
    finally:
        stop_worker(worker)


def test_a_two_node_ddp_job_completes_with_rank_0_on_node_0(node, second_node, make_job):
    job = make_job(script="ddp_world.py", distribution="ddp",
                   resources={"instance_type": "cpu", "instance_count": 2, "processes_per_node": 1})

    job = run_to_end(job, timeout=120)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    hosts = list(JobAttempt.objects.filter(job=job).order_by("node_rank").values_list("node__name", flat=True))
    assert hosts == sorted([node.name, second_node.name])
    for rank in (0, 1):
        assert f"WORLD_SIZE=2 RANK={rank} sum=2 SM_CURRENT_HOST={hosts[rank]}" in stored_text(
            f"{job.output_uri}/logs/rank-{rank}.log")
    assert _members(job.model_uri) == {"world.txt": b"2"}, "node 0 ran rank 0 and uploaded its model"
    wait_for(lambda: not JobAttempt.objects.filter(job=job, finished_at__isnull=True).exists(), timeout=30,
             message="both nodes to close their attempts")
    assert set(JobAttempt.objects.filter(job=job).values_list("outcome", flat=True)) == {"completed"}


def test_a_teardown_abort_on_node_1_while_rank_0_still_writes_the_model_leaves_the_result_to_node_0(
        node, second_node, make_job):
    # CI saw a two-node FSDP job fail with "rank 1 failed (killed by SIGABRT)" after a clean
    # run: node 1's ranks aborted at exit and node 1 failed the job before node 0 uploaded.
    job = make_job(script="teardown_abort_first.py",
                   resources={"instance_type": "cpu", "instance_count": 2, "processes_per_node": 1})

    job = run_to_end(job, timeout=120)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert _members(job.model_uri) == {"model.txt": b"trained"}
    notes = " ".join(job.events.values_list("message", flat=True))
    assert "teardown abort on node 1: rank 1 aborted at exit" in notes


@pytest.fixture
def third_node(node, second_node, node_worker: NodeWorker, isolated_storage, tmp_path) -> Iterator[Node]:
    worker = start_worker(f"test-node3-{uuid.uuid4().hex[:6]}", node_env(isolated_storage, node_worker.data_dir),
                          tmp_path / "third-worker.log")
    try:
        yield register_node(name=worker.name, instance_type="cpu", pid=worker.process.pid)
    finally:
        stop_worker(worker)


def test_a_teardown_abort_on_one_of_three_nodes_does_not_hold_the_others_in_torchruns_exit_barrier(
        node, second_node, third_node, make_job):
    # Node 1's ranks abort at exit; node 2's end cleanly, so its torchrun and node 0's wait in
    # the exit barrier for node 1's, which never comes (300 s). Node 0 ends the barrier for
    # both once node 1 has said it ended and node 2 that it waits.
    job = make_job(script="teardown_abort_one_of_three.py",
                   resources={"instance_type": "cpu", "instance_count": 3, "processes_per_node": 1})

    job = run_to_end(job, timeout=150)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    assert _members(job.model_uri) == {"model.txt": b"trained"}
    # Node 1 says what happened once it has seen node 0's result, which may be after the job ended.
    wait_for(lambda: not JobAttempt.objects.filter(job=job, finished_at__isnull=True).exists(), timeout=60,
             message="the three nodes to close their attempts")
    notes = " ".join(job.events.values_list("message", flat=True))
    assert "teardown abort on node 1: rank 1 aborted at exit" in notes, (
        list(job.events.values_list("status", "message")),
        list(JobAttempt.objects.filter(job=job).values("node_rank", "outcome", "failure_reason", "node__name")))
    outcomes = dict(JobAttempt.objects.filter(job=job).values_list("node_rank", "outcome"))
    assert outcomes == {0: "completed", 1: "completed", 2: "completed"}, outcomes
    assert (job.finished_at - job.started_at).total_seconds() < 120, "nobody waited out the 300 s barrier"
