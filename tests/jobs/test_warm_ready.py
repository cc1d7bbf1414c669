"""A warm pool is warm the moment its job ends: the node's fork server
(jobs.runner.warm) starts importing torch while the job that opens the pool still runs, so
a job submitted as soon as that one ended — every tuning trial, every edit-run loop — forks
from a server that was ready before the pool existed, instead of waiting for its import.

Proved by what happens, not by timing: the server is up (listening: its socket is bound
only after the preloads) while the first job is still Training, and the next job's
processes are that very server's children."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import psutil
import pytest

from datasets.storage import store_for
from jobs.models import JobAttempt, JobStatus, Node, NodeState, TrainingJob
from tests.conftest import wait_for
from tests.jobs.conftest import NodeWorker, run_to_end, wait_status

pytestmark = pytest.mark.slow


def fork_servers(worker: NodeWorker) -> dict[int, Path]:
    """pid → socket path of each fork server the node worker holds (its children)."""
    servers = {}
    for child in psutil.Process(worker.process.pid).children():
        try:
            command = child.cmdline()
        except psutil.Error:
            continue
        if "jobs.runner.process.forkserver" in command and "--socket" in command and child.status() != psutil.STATUS_ZOMBIE:
            servers[child.pid] = Path(command[command.index("--socket") + 1])
    return servers


def _seen(job: TrainingJob) -> dict:
    with store_for(job.model_uri).open_read(job.model_uri) as source, \
            tarfile.open(fileobj=io.BytesIO(source.read()), mode="r:gz") as archive:
        member = next(m for m in archive.getmembers() if Path(m.name).name == "argv.json")
        extracted = archive.extractfile(member)
        assert extracted is not None
        return json.loads(extracted.read())


def test_the_pools_fork_server_is_ready_before_its_first_job_ends(node, node_worker, make_job, tmp_path):
    # A server left by an earlier test's pool goes with its node (the heartbeat tidies it).
    wait_for(lambda: not fork_servers(node_worker), timeout=30, message="no fork server before the test")
    release = tmp_path / "release"
    first = make_job(script="wait_release.py", hyperparameters={"release": str(release)}, keep_alive_seconds=120)
    running = wait_status(_scheduled(first), JobStatus.TRAINING, timeout=120)
    assert not JobAttempt.objects.get(job=first).warm_start  # the pool's first job starts cold

    # While the first job runs (it cannot end before `release` exists), the server is up.
    servers = wait_for(lambda: {pid: path for pid, path in fork_servers(node_worker).items() if path.exists()},
                       timeout=60, message="a ready fork server while the pool's first job runs")
    running.refresh_from_db()
    assert running.status == JobStatus.TRAINING
    [(server_pid, _)] = servers.items()

    release.touch()
    first = wait_status(first, JobStatus.COMPLETED, JobStatus.FAILED, timeout=60)
    assert first.status == JobStatus.COMPLETED, first.failure_reason
    wait_for(lambda: Node.objects.filter(pk=node.pk, state=NodeState.WARM).exists(), timeout=30,
             message="the node to turn warm")
    # Submitted the moment the pool exists: it forks from the server that was ready already.
    second = run_to_end(make_job(script="argv_dump.py", keep_alive_seconds=120), timeout=120)

    assert second.status == JobStatus.COMPLETED, second.failure_reason
    assert second.warm_pool == f"pool-{first.pk}" and JobAttempt.objects.get(job=second).warm_start
    seen = _seen(second)
    assert seen["torch_preloaded"] and seen["starter_pid"] == server_pid
    assert fork_servers(node_worker).keys() == {server_pid}  # and it stays for the pool's next job
    notes = " ".join(second.events.values_list("message", flat=True))
    assert "starting cold" not in notes
    assert os.path.exists(servers[server_pid])


def _scheduled(job: TrainingJob) -> TrainingJob:
    from jobs.scheduling import schedule_jobs

    assert job.pk in schedule_jobs()
    return job
