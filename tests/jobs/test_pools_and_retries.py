"""The scheduler's side of priorities, warm pools and retries after a lost node (the
processes' side runs in tests/chaos and tests/scale)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.nodes import mark_lost_nodes
from jobs.recovery import end_attempt
from jobs.scheduling import expire_warm_pools, schedule_jobs
from tests.jobs.test_scheduling import _job, _node, _reload

pytestmark = pytest.mark.django_db(transaction=True)


def _warm(nodes: list[Node], job: TrainingJob, pool: str, *, seconds: float = 60) -> None:
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(
        state=NodeState.WARM, current_job=None, warm_pool=pool, warm_project=job.project, warm_from_job=job,
        warm_instance_count=job.instance_count, warm_until=timezone.now() + timedelta(seconds=seconds))


def test_a_higher_priority_job_starts_before_older_ones(make_job):
    _node()
    older = _job(make_job, age=60)
    urgent = _job(make_job)
    TrainingJob.objects.filter(pk=urgent.pk).update(priority=10)

    assert schedule_jobs() == [urgent.pk]
    assert _reload(older).status == JobStatus.PENDING


def test_a_matching_job_takes_the_warm_pool_and_others_do_not(make_job, other_project):
    a, b = _node("a"), _node("b")
    done = _job(make_job, nodes=2)
    _warm([a, b], done, "pool-x")
    stranger = make_job(script="quick.py", project=other_project,
                        resources={"instance_type": "cpu", "instance_count": 2, "processes_per_node": 1})
    single = _job(make_job, nodes=1)

    assert schedule_jobs() == [], "warm nodes are held for their pool's next job only"
    assert "held warm for other jobs" in _reload(single).waiting_reason

    match = _job(make_job, nodes=2)
    assert schedule_jobs() == [match.pk]
    match = _reload(match)
    assert match.warm_pool == "pool-x"
    assert set(JobAttempt.objects.filter(job=match).values_list("node_id", flat=True)) == {a.pk, b.pk}
    assert all(JobAttempt.objects.filter(job=match).values_list("warm_start", flat=True))
    assert "warm pool pool-x" in match.events.last().message
    assert _reload(stranger).status == JobStatus.PENDING


def test_an_expired_pool_frees_its_nodes_for_anyone(make_job):
    a = _node("a")
    done = _job(make_job)
    _warm([a], done, "pool-y", seconds=-1)

    assert expire_warm_pools() == 1
    a.refresh_from_db()
    assert (a.state, a.warm_pool, a.warm_until) == (NodeState.IDLE, "", None)


def test_a_pool_missing_a_node_is_not_used(make_job):
    a, b = _node("a"), _node("b")
    done = _job(make_job, nodes=2)
    _warm([a], done, "pool-z")  # b went idle (its agent failed to go warm): half a pool
    match = _job(make_job, nodes=2)
    assert schedule_jobs() == []
    assert _reload(match).warm_pool == ""
    assert b.pk  # idle, but one idle node is not a gang of two


def test_a_lost_node_requeues_its_job_within_retries(make_job, settings):
    node = _node()
    job = _job(make_job)
    TrainingJob.objects.filter(pk=job.pk).update(retries=1)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING)
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=settings.STUDIO_NODE_LOST_SECONDS + 1))

    assert mark_lost_nodes() == 1

    job = _reload(job)
    assert (job.status, job.attempt) == (JobStatus.PENDING, 1)
    assert f"node {node.name} was lost" in job.waiting_reason
    assert JobAttempt.objects.get(job=job, attempt=1).outcome == "lost"
    node.refresh_from_db()
    assert (node.state, node.current_job) == (NodeState.LOST, None)
    # The next attempt goes to another node.
    other = _node("b")
    assert schedule_jobs() == [job.pk]
    job = _reload(job)
    assert job.attempt == 2
    assert JobAttempt.objects.get(job=job, attempt=2).node_id == other.pk


def test_retries_run_out(make_job):
    _node()
    job = _job(make_job)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING, retries=1, attempt=2)
    JobAttempt.objects.filter(job=job).update(attempt=2)

    assert end_attempt(job.pk, 2, cause="node x was lost") == "failed"
    job = _reload(job)
    assert job.status == JobStatus.FAILED
    assert job.failure_reason == "infrastructure error: node x was lost; all 1 retries are used"


def test_ending_an_attempt_twice_or_a_stale_one_changes_nothing(make_job):
    _node()
    job = _job(make_job)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING, retries=3)

    assert end_attempt(job.pk, 1, cause="lost") == "requeued"
    assert end_attempt(job.pk, 1, cause="lost again") == ""
    assert _reload(job).events.filter(message__contains="retrying").count() == 1


def test_a_stopping_job_whose_node_is_lost_ends_stopped(make_job):
    _node()
    job = _job(make_job)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.STOPPING, retries=3)
    assert end_attempt(job.pk, 1, cause="node x was lost") == "stopped"
    assert _reload(job).status == JobStatus.STOPPED


def test_a_node_that_restarts_mid_job_ends_the_attempt_at_once(make_job):
    from jobs.nodes import register_node

    node = _node()
    job = _job(make_job)
    TrainingJob.objects.filter(pk=job.pk).update(retries=2)
    schedule_jobs()
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.TRAINING)

    register_node(name=node.name, instance_type="cpu", pid=2)  # a new worker process under the same name

    job = _reload(job)
    assert (job.status, job.attempt) == (JobStatus.PENDING, 1)
    assert f"node {node.name} restarted" in job.waiting_reason
    assert JobAttempt.objects.get(job=job, attempt=1).outcome == "lost"
    node.refresh_from_db()
    assert (node.state, node.current_job) == (NodeState.IDLE, None)
    assert schedule_jobs() == [job.pk], "the restarted node takes the retry"
