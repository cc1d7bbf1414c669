"""The scheduler tick: FIFO, gangs all-or-nothing, reasons for waiting, expired leases.
Nodes here are rows only (no worker): the tasks sent land in their queues, unconsumed."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.nodes import MachineResources, register_node
from jobs.scheduling import schedule_jobs
from studio.redis_conn import redis_client

pytestmark = pytest.mark.django_db(transaction=True)


def _node(prefix: str = "n", *, kind: str = "cpu", cpus: int = 4, gpus: int = 0) -> Node:
    return register_node(name=f"{prefix}-{uuid.uuid4().hex[:6]}", instance_type=kind, pid=1,
                         resources=MachineResources(cpus=cpus, memory_bytes=8 * 2**30, gpus=gpus))


def _job(make_job, *, nodes: int = 1, kind: str = "cpu", per_node: int = 1, age: float = 0) -> TrainingJob:
    job = make_job(script="quick.py", resources={"instance_type": kind, "instance_count": nodes,
                                                 "processes_per_node": per_node})
    if age:
        TrainingJob.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(seconds=age))
    return job


def _reload(job: TrainingJob) -> TrainingJob:
    job.refresh_from_db()
    return job


def test_oldest_pending_job_starts_first_and_the_next_one_says_why_it_waits(make_job):
    node = _node()
    newer = _job(make_job)
    older = _job(make_job, age=60)  # created first, although its row came second

    assert schedule_jobs() == [older.pk]

    older, newer = _reload(older), _reload(newer)
    assert (older.status, older.attempt, older.waiting_reason) == (JobStatus.STARTING, 1, "")
    assert older.lease_expires_at > timezone.now()
    node.refresh_from_db()
    assert (node.state, node.current_job_id) == (NodeState.BUSY, older.pk)
    assert list(JobAttempt.objects.filter(job=older).values_list("attempt", "node_rank", "node")) == [(1, 0, node.pk)]
    assert newer.status == JobStatus.PENDING
    assert newer.waiting_reason == "waiting for 1 cpu node; 0 idle, 1 registered"
    assert redis_client().llen(node.queue) >= 1, "run_node_task was sent to the node's own queue"


def test_a_gang_gets_all_its_nodes_at_once_or_none(make_job):
    first, second = _node(), _node()
    Node.objects.filter(pk=second.pk).update(state=NodeState.BUSY)
    gang = _job(make_job, nodes=2)

    assert schedule_jobs() == []

    assert _reload(gang).waiting_reason == "waiting for 2 cpu nodes; 1 idle, 2 registered"
    first.refresh_from_db()
    assert first.state == NodeState.IDLE and first.current_job is None, "no part of a gang is held"

    Node.objects.filter(pk=second.pk).update(state=NodeState.IDLE)
    assert schedule_jobs() == [gang.pk]

    attempts = JobAttempt.objects.filter(job=gang, attempt=1).order_by("node_rank")
    assert [a.node_id for a in attempts] == sorted([first.pk, second.pk], key=lambda pk: Node.objects.get(pk=pk).name)
    assert set(Node.objects.filter(current_job=gang).values_list("state", flat=True)) == {NodeState.BUSY}


def test_a_waiting_gang_holds_back_later_jobs_of_its_type_only(make_job):
    _node(), _node(kind="gpu", gpus=1)
    busy = _node()
    Node.objects.filter(pk=busy.pk).update(state=NodeState.BUSY)
    gang = _job(make_job, nodes=2, age=30)
    small = _job(make_job, age=20)
    gpu_job = _job(make_job, kind="gpu", age=10)

    assert schedule_jobs() == [gpu_job.pk]

    assert _reload(small).waiting_reason == f"waiting for 1 cpu node; 1 idle, 2 registered; job #{gang.pk} is ahead in the queue"
    assert _reload(small).status == JobStatus.PENDING


def test_a_job_wanting_more_nodes_than_registered_waits_without_blocking_others(make_job):
    _node(), _node()
    too_big = _job(make_job, nodes=4, age=30)
    small = _job(make_job)

    assert schedule_jobs() == [small.pk]

    assert _reload(too_big).waiting_reason == "waiting for 4 cpu nodes; 2 idle, 2 registered"


def test_no_registered_node_of_the_type_says_so(make_job):
    job = _job(make_job, kind="gpu")

    assert schedule_jobs() == []

    assert _reload(job).waiting_reason == "waiting for 1 gpu node; 0 idle, 0 registered"


def test_nodes_without_recent_heartbeats_are_not_used(make_job):
    stale = _node()
    Node.objects.filter(pk=stale.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))
    job = _job(make_job)

    assert schedule_jobs() == []

    assert _reload(job).waiting_reason == "waiting for 1 cpu node; 0 idle, 0 registered"


def test_more_processes_per_node_than_any_node_has_fails_the_job(make_job):
    _node(cpus=2)
    job = _job(make_job, per_node=8)

    assert schedule_jobs() == []

    job = _reload(job)
    assert job.status == JobStatus.FAILED
    assert job.failure_reason == ("8 processes per node do not fit any cpu node (the largest has 2 CPUs and 0 GPUs); "
                                  "use processes_per_node ≤ 2")


def test_a_job_whose_agent_stopped_renewing_its_lease_fails_and_frees_its_node(make_job):
    node = _node()
    job = _job(make_job)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING,
                                                 lease_expires_at=timezone.now() - timedelta(seconds=1))

    schedule_jobs()

    job = _reload(job)
    assert job.status == JobStatus.FAILED
    assert job.failure_reason.startswith(f"infrastructure error: the node agent on {node.name} stopped renewing")
    node.refresh_from_db()
    assert (node.state, node.current_job) == (NodeState.IDLE, None)
    assert JobAttempt.objects.get(job=job).outcome == "lost"


def test_a_redelivered_or_stale_launch_is_a_no_op(make_job):
    from jobs.runner.agent import run_node

    _node()
    job = _job(make_job)
    schedule_jobs()
    JobAttempt.objects.filter(job=job).update(outcome="running")  # an agent has it already

    assert run_node(job.pk, 1, 0) == "skipped"
    assert run_node(job.pk, 2, 0) == "skipped"
    assert _reload(job).status == JobStatus.STARTING


def test_a_job_stopped_between_placement_and_its_claim_ends_stopped_at_once(make_job):
    """Seen once in a walk: a tuning job's pruner stopped a trial 17 ms after it went
    Starting; the node's claim refused a Stopping job, nobody ended it, and it stayed
    Stopping — billed — for 120 s, until its lease ran out."""
    from jobs.actions import stop_job
    from jobs.runner.agent import run_node

    node = _node()
    job = _job(make_job)
    schedule_jobs()
    assert _reload(job).status == JobStatus.STARTING
    stop_job(_reload(job), reason="EarlyStopped")
    assert _reload(job).status == JobStatus.STOPPING

    assert run_node(job.pk, 1, 0) == "stopped"
    job = _reload(job)
    assert (job.status, job.stop_reason) == (JobStatus.STOPPED, "EarlyStopped")
    launch = JobAttempt.objects.get(job=job, attempt=1, node_rank=0)
    assert launch.finished_at is not None and launch.outcome == "stopped" and launch.billable_seconds is not None
    assert launch.billable_seconds < 5, launch.billable_seconds
    node.refresh_from_db()
    assert node.state == NodeState.IDLE and node.current_job is None
    assert run_node(job.pk, 1, 0) == "skipped", "a redelivered task still finds nothing to do"


def test_a_gang_stopped_before_its_claims_frees_every_node(make_job):
    from jobs.actions import stop_job
    from jobs.runner.agent import run_node

    nodes = [_node(), _node()]
    gang = _job(make_job, nodes=2)
    assert schedule_jobs() == [gang.pk]
    stop_job(_reload(gang))
    assert run_node(gang.pk, 1, 0) == "stopped"
    assert _reload(gang).status == JobStatus.STOPPED
    assert run_node(gang.pk, 1, 1) == "skipped", "node 1's late task: the job has ended"
    for node in nodes:
        node.refresh_from_db()
        assert node.state == NodeState.IDLE and node.current_job is None, node.name
    launches = JobAttempt.objects.filter(job=gang, attempt=1).order_by("node_rank")
    assert [(a.outcome, a.finished_at is not None, a.billable_seconds is not None) for a in launches] == [
        ("stopped", True, True), ("stopped", True, True)]
