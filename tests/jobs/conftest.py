"""Fixtures for training jobs: a real node worker process (`studio worker`) against the
test database, and small factories for jobs, scripts and dataset versions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from datasets.models import DatasetVersion
from datasets.storage import default_store, object_uri
from jobs.models import FINISHED_STATUSES, JobAttempt, JobStatus, Node, NodeState, TrainingJob
from jobs.nodes import register_node
from jobs.transitions import transition
from tests import factories
from tests.conftest import ROOT, wait_for, worker_env
from trainyard.protocol import EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TEST_LOG_MAX_BYTES = 2 * 1024 * 1024
TEST_STOP_GRACE_SECONDS = 2


@dataclass
class NodeWorker:
    name: str
    process: subprocess.Popen
    log_path: Path
    data_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None


def start_worker(name: str, env: dict[str, str], log_path: Path) -> NodeWorker:
    """A `studio worker` process, ready to take tasks (fails the test if it cannot start)."""
    data_dir = Path(env["STUDIO_DATA_DIR"])
    for _ in range(2):
        with open(log_path, "wb") as out:
            process = subprocess.Popen([sys.executable, "manage.py", "studio", "worker", "--queue", "cpu", "--name", name],
                                       cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        worker = NodeWorker(name, process, log_path, data_dir)
        wait_for(lambda w=worker: b"ready." in log_path.read_bytes() or not w.alive(), timeout=90, message="a node worker")
        if worker.alive():
            return worker
        # SQLite through DATABASE_URL runs without IMMEDIATE transactions: registering (a
        # read, then a write) can lose to another worker's heartbeat. Once more, then fail.
        if b"database is locked" not in log_path.read_bytes():
            break
    pytest.fail(f"node worker {name} exited at start:\n{log_path.read_text(errors='replace')[-5000:]}")


def stop_worker(worker: NodeWorker) -> int | None:
    if worker.alive():
        os.killpg(worker.process.pid, signal.SIGTERM)
        try:
            return worker.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
    return worker.process.returncode


def node_env(isolated_storage, data_dir: Path) -> dict[str, str]:
    return {**worker_env(isolated_storage), "STUDIO_DATA_DIR": str(data_dir),
            "STUDIO_STOP_GRACE_SECONDS": str(TEST_STOP_GRACE_SECONDS), "STUDIO_NODE_HEARTBEAT_SECONDS": "1",
            "STUDIO_JOB_SYNC_SECONDS": "1", "STUDIO_LOG_MAX_BYTES": str(TEST_LOG_MAX_BYTES),
            "STUDIO_SYSTEM_METRICS_SECONDS": "1"}


@pytest.fixture(scope="session")
def node_worker(django_db_setup, isolated_storage, tmp_path_factory) -> Iterator[NodeWorker]:
    """One `studio worker` process for the whole session (starting one costs seconds).
    Its Node row is re-registered before each test (`node`): transactional tests empty
    the tables after themselves."""
    base = tmp_path_factory.mktemp("node")
    worker = start_worker(f"test-node-{uuid.uuid4().hex[:8]}", node_env(isolated_storage, base / "data"),
                          base / "worker.log")
    try:
        yield worker
    finally:
        stop_worker(worker)


@pytest.fixture
def node(node_worker: NodeWorker, transactional_db) -> Iterator[Node]:
    """The session's worker as an idle node of this test's database; afterwards the
    worker must still be alive and the node free (a test's job must not leak into the next)."""
    assert node_worker.alive(), node_worker.log()[-5000:]
    registered = register_node(name=node_worker.name, instance_type="cpu", pid=node_worker.process.pid)
    yield registered
    for job in TrainingJob.objects.exclude(status__in=FINISHED_STATUSES):
        transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING])
    wait_for(lambda: not Node.objects.filter(name=node_worker.name, state=NodeState.BUSY).exists(), timeout=60,
             message="the node to be released")
    assert node_worker.alive(), node_worker.log()[-5000:]


# --- factories ------------------------------------------------------------------------------------
def upload_script(name: str, project_slug: str = "acme") -> str:
    uri = object_uri(f"scripts/{project_slug}/tests/{name}")
    default_store().put_file(SCRIPTS / name, uri)
    return uri


@pytest.fixture
def make_job(project) -> Callable[..., TrainingJob]:
    """make_job(script="quick.py", inputs={"train": version}, **fields) → a Pending job
    with its inputs, as submit_job would create it (output_uri, first timeline entry)."""

    def make(*, script: str = "", inputs: dict | None = None, **overrides) -> TrainingJob:
        fields: dict = {"name": overrides.pop("name", f"job-{uuid.uuid4().hex[:6]}"),
                        "resources": {"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1}}
        if script:
            fields.update(script_uri=upload_script(script, project.slug), entry_point=script)
        fields.update(overrides)
        job = factories.make_job(fields.pop("project", project), inputs=inputs, submitted=True, **fields)
        clear_job_streams(job.pk)
        return job

    return make


@pytest.fixture
def make_version(project, tmp_path) -> Callable[..., DatasetVersion]:
    """make_version({"data.csv": "x,y\\n1,2\\n"}, split={...}) → a ready, validated version."""

    def make(files: dict[str, str | bytes], *, name: str = "", split: dict | None = None, format: str = "",
             delimiter: str = "") -> DatasetVersion:
        return factories.make_version(project, tmp_path, files, name=name, split=split, format=format,
                                      delimiter=delimiter)

    return make


def clear_job_streams(job_id: int) -> None:
    """A fresh test database numbers jobs from 1 again, but a shared Redis (CI's) still
    holds the streams of an earlier run's job 1: start each job with none."""
    from studio.redis_conn import redis_client

    redis_client().delete(*(key(template, job_id) for template in (LOGS_STREAM, METRICS_STREAM, EVENTS_STREAM,
                                                                   SYSTEM_STREAM)))


# --- waiting and reading --------------------------------------------------------------------------
def wait_status(job: TrainingJob, *statuses: str, timeout: float = 60) -> TrainingJob:
    def reached():
        job.refresh_from_db()
        return job.status in statuses

    try:
        wait_for(reached, timeout=timeout, interval=0.2, message=f"job {job.pk} to reach {'/'.join(statuses)}")
    except AssertionError:
        raise AssertionError(f"job {job.pk} is {job.status} ({job.failure_reason}); timeline: "
                             f"{list(job.events.values_list('status', 'message'))}") from None
    return job


def live_log_lines(job_id: int) -> list[dict]:
    from studio.redis_conn import redis_client

    entries = redis_client().xrange(key(LOGS_STREAM, job_id))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def metric_points(job_id: int) -> list[tuple[int, str, int, float]]:
    """(rank, name, step, value) of every point sent to the job's metric stream."""
    from studio.redis_conn import redis_client

    points = []
    for _, fields in redis_client().xrange(key(METRICS_STREAM, job_id)):
        rank = int(fields[b"r"])
        points += [(rank, name, step, value) for name, step, value, _ in json.loads(fields[b"p"])]
    return points


def stored_text(uri: str) -> str:
    from datasets.storage import store_for

    with store_for(uri).open_read(uri) as source:
        return source.read().decode(errors="replace")


def run_to_end(job: TrainingJob, timeout: float = 90) -> TrainingJob:
    from jobs.scheduling import schedule_jobs

    assert job.pk in schedule_jobs()
    return wait_status(job, *FINISHED_STATUSES, timeout=timeout)



def status_changes(job: TrainingJob) -> list[str]:
    """The timeline's statuses without repeats (notes repeat the current status)."""
    changes: list[str] = []
    for status in job.events.order_by("at", "pk").values_list("status", flat=True):
        if not changes or changes[-1] != status:
            changes.append(status)
    return changes


def finished_attempt(job: TrainingJob, node_rank: int = 0) -> JobAttempt:
    """The job's latest attempt on node_rank once its agent closed it (moments after the
    job's final status: the agent records the outcome, then releases the node)."""
    return wait_for(lambda: JobAttempt.objects.filter(job=job, node_rank=node_rank, finished_at__isnull=False)
                    .order_by("-attempt").first(), timeout=30, message=f"job {job.pk}'s attempt to close")
