"""Fixtures for hyperparameter searches: two real node workers (`studio worker`) against
the test database, the quadratic test script, and a driver that does what the control
worker and the flusher would (schedule, flush metrics, tick the engine) until a condition
holds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from datasets.storage import default_store, object_uri
from jobs.metrics.ingest import Flusher
from jobs.models import FINISHED_STATUSES, JobStatus, MetricPoint, Node, NodeState, TrainingJob
from jobs.nodes import register_node
from jobs.transitions import transition
from tests.conftest import wait_for
from tests.jobs.conftest import NodeWorker, node_env, start_worker, stop_worker
from tuning.engine import advance
from tuning.models import TuningJob

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture(scope="session")
def tuning_workers(django_db_setup, isolated_storage, tmp_path_factory) -> Iterator[list[NodeWorker]]:
    """Two `studio worker` processes for the package (starting one costs seconds); their
    Node rows are registered per test (`nodes`)."""
    base = tmp_path_factory.mktemp("tuning-nodes")
    workers: list[NodeWorker] = []
    try:
        for index in range(2):
            # Same data directory: simulated nodes on one machine share the dataset cache.
            workers.append(start_worker(f"test-tune-{index}-{uuid.uuid4().hex[:6]}",
                                        node_env(isolated_storage, base / "data"), base / f"worker-{index}.log"))
        yield workers
    finally:
        for worker in workers:
            stop_worker(worker)


@pytest.fixture
def nodes(tuning_workers: list[NodeWorker], transactional_db) -> Iterator[list[Node]]:
    """Both workers as idle cpu nodes of this test's database; afterwards they must be
    alive and free (a test's trials must not leak into the next)."""
    for worker in tuning_workers:
        assert worker.alive(), worker.log()[-5000:]
    registered = [register_node(name=w.name, instance_type="cpu", pid=w.process.pid) for w in tuning_workers]
    yield registered
    for job in TrainingJob.objects.exclude(status__in=FINISHED_STATUSES):
        transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING])
    names = [w.name for w in tuning_workers]
    wait_for(lambda: not Node.objects.filter(name__in=names, state=NodeState.BUSY).exists(), timeout=60,
             message="the nodes to be released")
    for worker in tuning_workers:
        assert worker.alive(), worker.log()[-5000:]


def upload_script(name: str, project_slug: str = "acme") -> str:
    uri = object_uri(f"scripts/{project_slug}/tests/{name}")
    default_store().put_file(SCRIPTS / name, uri)
    return uri


@pytest.fixture
def quadratic(project) -> dict:
    """The base job of a search over the quadratic script (tests/tuning/scripts)."""
    uri = upload_script("quadratic.py", project.slug)
    return {"script": {"uri": uri, "entry_point": "quadratic.py"}, "hyperparameters": {"steps": 3},
            "resources": {"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1}}


def body(base_job: dict, **overrides) -> dict:
    """A POST /api/v1/tuning-jobs/ body searching x and y of the quadratic script."""
    return {"project": "acme", "name": "quad", "base_job": base_job,
            "parameter_ranges": {"x": {"type": "continuous", "min": -2, "max": 3},
                                 "y": {"type": "continuous", "min": -4, "max": 1}},
            "objective": {"metric": "loss", "goal": "minimize"}, "strategy": "random", "max_trials": 4,
            "max_parallel": 1, "seed": 7, **overrides}


def create(client, payload: dict) -> TuningJob:
    response = client.post("/api/v1/tuning-jobs/", payload, format="json")
    assert response.status_code == 201, response.content
    return TuningJob.objects.get(pk=response.json()["id"])


def drive(tuning: TuningJob, until: Callable[[TuningJob], bool], *, timeout: float = 90,
          every: Callable[[TuningJob], None] | None = None) -> TuningJob:
    """Schedule, flush metrics and tick the engine, as the control worker and the flusher
    would, until `until(tuning)` holds (the tuning job reloaded each round)."""
    from jobs.scheduling import schedule_jobs

    flusher = Flusher()
    deadline = time.monotonic() + timeout
    while True:
        schedule_jobs()
        while flusher.flush_once(block_ms=0):
            pass
        advance(tuning.pk)
        tuning.refresh_from_db()
        if every is not None:
            every(tuning)
        if until(tuning):
            return tuning
        if time.monotonic() > deadline:
            trials = list(tuning.trials.order_by("trial_number").values_list("trial_number", "status", "failure_reason"))
            raise AssertionError(f"tuning job {tuning.pk} is {tuning.status} ({tuning.end_reason}, "
                                 f"{tuning.failure_reason}); trials: {trials}")
        time.sleep(0.2)


def trials_of(tuning: TuningJob) -> list[TrainingJob]:
    return list(tuning.trials.order_by("trial_number"))


def finish_trial(job: TrainingJob, *, loss: float | None = None, status: str = JobStatus.COMPLETED,
                 steps: int = 3, failure_reason: str = "") -> None:
    """End a trial without running it (for engine tests that need no node): its loss
    points (decreasing to `loss`) as the flusher would have written them, then its status."""
    now = timezone.now()
    if loss is not None:
        MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", step=step, rank=0, time=now,
                                                     value=loss + (steps - 1 - step)) for step in range(steps)])
    assert transition(job.pk, status, from_statuses=[JobStatus.PENDING, JobStatus.STARTING, JobStatus.TRAINING],
                      started_at=now - timedelta(seconds=1), failure_reason=failure_reason)
