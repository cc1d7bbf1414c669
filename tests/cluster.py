"""A whole simulated studio back end for scale-out and chaos tests: its own durable Redis
(append-only, fsync always), a control worker (Celery + beat: scheduling, the lost-node
sweep), a metrics flusher and three node workers of instance type "sim" — real processes
against the test database, so the tests drive it only through the database and kill or
restart any part of it.

Nodes are of type "sim", not "cpu": the session's own node worker (tests/jobs/conftest.py)
listens on the tests' Redis, and a job placed on it by this cluster's scheduler would
never arrive. Jobs for the cluster ask for `instance_type: "sim"`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from studio.embedded_redis import EmbeddedRedis
from tests.conftest import ROOT, wait_for, worker_env

INSTANCE_TYPE = "sim"
NODE_COUNT = 3
LOST_SECONDS = 5
HEARTBEAT_SECONDS = 1


@dataclass
class Process:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen | None = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Cluster:
    base: Path
    env: dict[str, str]
    redis: EmbeddedRedis
    control: Process
    flusher: Process
    nodes: list[Process] = field(default_factory=list)

    # --- processes ---------------------------------------------------------------------------
    def start(self, part: Process, ready: bytes | None = b"ready.") -> None:
        # The log is appended to across restarts: only a "ready" written after this start counts.
        offset = part.log_path.stat().st_size if part.log_path.exists() else 0
        with open(part.log_path, "ab") as out:
            part.process = subprocess.Popen(part.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        if ready is not None:
            wait_for(lambda: ready in part.log_path.read_bytes()[offset:] or not part.alive(), timeout=90,
                     message=f"{part.name} to start")
            if not part.alive():
                pytest.fail(f"{part.name} exited at start:\n{part.log()[-4000:]}")

    def kill(self, part: Process, *, tree: bool = True) -> list[int]:
        """SIGKILL the process and (tree) every process below it, the way a machine dies."""
        assert part.process is not None
        victims = [part.process.pid]
        if tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                victims += [child.pid for child in psutil.Process(part.process.pid).children(recursive=True)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        part.process.wait(10)
        return victims

    def stop(self, part: Process) -> None:
        if part.alive():
            assert part.process is not None
            os.killpg(part.process.pid, signal.SIGTERM)
            try:
                part.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(part.process.pid, signal.SIGKILL)
                part.process.wait()

    def node(self, name: str) -> Process:
        return next(n for n in self.nodes if n.name == name)

    def restart_redis(self, down_seconds: float = 2.0) -> None:
        """SIGKILL Redis, leave it down a while, start it again on the same port and data."""
        assert self.redis.process is not None
        self.redis.process.kill()
        self.redis.process.wait(10)
        time.sleep(down_seconds)
        self.redis.start()

    def heal(self) -> None:
        """Whatever a test killed comes back, so the next test finds the whole cluster."""
        if self.redis.process is None or self.redis.process.poll() is not None:
            self.redis.start()
        for part in (self.control, self.flusher, *self.nodes):
            if not part.alive():
                self.start(part, ready=b"flusher: started" if part is self.flusher else b"ready.")

    def register_nodes(self) -> None:
        """Node rows for this test's database (transactional tests empty the tables)."""
        from jobs.nodes import register_node

        for part in self.nodes:
            assert part.process is not None
            register_node(name=part.name, instance_type=INSTANCE_TYPE, pid=part.process.pid)

    def shutdown(self) -> None:
        for part in (*self.nodes, self.control, self.flusher):
            self.stop(part)
        self.redis.stop()


def start_cluster(isolated_storage, base: Path) -> Cluster:
    redis = EmbeddedRedis(data_dir=base / "redis", durable="always")
    redis.start()
    env = {**worker_env(isolated_storage), "REDIS_URL": redis.url, "STUDIO_DATA_DIR": str(base / "data"),
           "STUDIO_NODE_LOST_SECONDS": str(LOST_SECONDS), "STUDIO_NODE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
           "STUDIO_STOP_GRACE_SECONDS": "2", "STUDIO_JOB_SYNC_SECONDS": "1", "STUDIO_SYSTEM_METRICS_SECONDS": "1",
           "STUDIO_JOB_LEASE_SECONDS": "30", "STUDIO_RULES_TICK_SECONDS": "1", "STUDIO_WEBHOOK_ATTEMPTS": "3",
           "STUDIO_WEBHOOK_BACKOFF_SECONDS": "1"}
    manage = [sys.executable, "manage.py", "studio"]
    suffix = uuid.uuid4().hex[:6]
    cluster = Cluster(
        base=base, env=env, redis=redis,
        control=Process("control", [*manage, "control"], base / "control.log"),
        flusher=Process("flusher", [*manage, "flusher"], base / "flusher.log"),
        nodes=[Process(f"sim-{i}-{suffix}", [*manage, "worker", "--queue", INSTANCE_TYPE, "--name", f"sim-{i}-{suffix}"],
                       base / f"sim-{i}.log") for i in range(NODE_COUNT)],
    )
    try:
        cluster.start(cluster.control)
        cluster.start(cluster.flusher, ready=b"flusher: started")
        for part in cluster.nodes:
            cluster.start(part)
    except BaseException:
        cluster.shutdown()
        raise
    return cluster


def wait_job(cluster: Cluster, *jobs, statuses=None, timeout: float = 90):
    """Wait until every job reaches one of `statuses` (default: a finished one); on a
    timeout fail with the jobs' timelines and the tail of every process's log."""
    from jobs.models import FINISHED_STATUSES

    wanted = set(statuses or FINISHED_STATUSES)

    def reached():
        for job in jobs:
            job.refresh_from_db()
        return all(job.status in wanted for job in jobs)

    try:
        wait_for(reached, timeout=timeout, interval=0.25, message=f"jobs {[j.pk for j in jobs]} to reach {wanted}")
    except AssertionError:
        timelines = {job.pk: (job.status, job.failure_reason, list(job.events.values_list("status", "message")))
                     for job in jobs}
        raise AssertionError(f"{timelines}\n{dump(cluster)}") from None
    return jobs[0] if len(jobs) == 1 else jobs


def dump(cluster: Cluster) -> str:
    """The tail of every log, for a failing assertion."""
    return "\n".join(f"--- {part.name} ---\n{part.log()[-3000:]}" for part in (cluster.control, cluster.flusher,
                                                                              *cluster.nodes))


# --- fixtures: imported by the conftest of each package that uses the cluster ----------------
@pytest.fixture(scope="package")
def cluster_processes(django_db_setup, isolated_storage, tmp_path_factory):
    """Redis, control worker, flusher and three "sim" node workers, started once per test
    package that imports this fixture and stopped after its last test: the cluster's
    control worker schedules every Pending job of the test database and sweeps every
    node, so it must not run while other tests place jobs on the session's node worker."""
    cluster = start_cluster(isolated_storage, tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def cluster(cluster_processes, transactional_db):
    """The cluster with its nodes registered in this test's database; afterwards anything
    a test killed is started again and no job of the test is left running."""
    from jobs.models import FINISHED_STATUSES, JobStatus, Node, NodeState, TrainingJob
    from jobs.transitions import transition

    cluster_processes.heal()
    cluster_processes.register_nodes()
    yield cluster_processes
    for job in TrainingJob.objects.exclude(status__in=FINISHED_STATUSES):
        if not transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING]):
            transition(job.pk, JobStatus.STOPPED, from_statuses=[JobStatus.PENDING])
    wait_for(lambda: not Node.objects.filter(state=NodeState.BUSY).exists(), timeout=60,
             message="the cluster's nodes to be released")
    cluster_processes.heal()
