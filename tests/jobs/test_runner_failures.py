"""Bad jobs end with a reason a person can act on, and the same worker runs a good job next."""

from __future__ import annotations

import os
import uuid

import psutil
import pytest

from jobs.models import JobStatus, Node, NodeState
from jobs.nodes import register_node
from jobs.scheduling import schedule_jobs
from jobs.transitions import transition
from tests.conftest import wait_for
from tests.jobs.conftest import (
    TEST_LOG_MAX_BYTES,
    TEST_STOP_GRACE_SECONDS,
    finished_attempt,
    node_env,
    run_to_end,
    start_worker,
    stop_worker,
    stored_text,
    wait_status,
)

pytestmark = pytest.mark.slow


def assert_worker_runs_a_good_job(make_job) -> None:
    job = run_to_end(make_job(script="quick.py"))
    assert job.status == JobStatus.COMPLETED, job.failure_reason


def test_a_failing_script_fails_with_the_reason_it_wrote(node, make_job):
    job = run_to_end(make_job(script="fail_with_reason.py", hyperparameters={"mode": "file"}))

    assert job.status == JobStatus.FAILED
    assert job.failure_reason == "epochs must be positive, got -1"
    attempt = finished_attempt(job)
    assert (attempt.outcome, attempt.exit_code) == ("failed", 2)
    assert_worker_runs_a_good_job(make_job)


def test_a_crashing_script_fails_with_its_last_stderr_lines_and_exit_code(node, make_job):
    job = run_to_end(make_job(script="fail_with_reason.py", hyperparameters={"mode": "raise"}))

    assert job.status == JobStatus.FAILED
    assert job.failure_reason.startswith("rank 0 failed (exit code 1); the last lines of its stderr:")
    assert "ValueError: the learning rate 7.5 is far too high" in job.failure_reason
    assert "Traceback (most recent call last)" in job.failure_reason
    assert "ValueError: the learning rate 7.5" in stored_text(f"{job.output_uri}/logs/rank-0.log")


def test_a_100_mb_print_flood_completes_with_its_log_capped(node, make_job):
    job = run_to_end(make_job(script="print_flood.py", metric_definitions=[{"name": "loss", "regex": r"loss=([0-9.]+)"}]),
                     timeout=180)

    assert job.status == JobStatus.COMPLETED, job.failure_reason
    text = stored_text(f"{job.output_uri}/logs/rank-0.log")
    assert "[trainyard] log cut: further output of rank 0 dropped" in text
    assert len(text) < TEST_LOG_MAX_BYTES + 300 * 1024, "capped: the cap plus the note and the last lines"
    assert text.rstrip().endswith("flood over loss=0.5"), "the end of the output is kept after the cut"
    assert_worker_runs_a_good_job(make_job)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(node, make_job, tmp_path):
    pid_file = tmp_path / "child.pid"
    job = make_job(script="ignore_sigterm_child.py", hyperparameters={"pid-file": str(pid_file)})
    assert job.pk in schedule_jobs()
    wait_for(pid_file.exists, timeout=30, message="the child to start")
    child = psutil.Process(int(pid_file.read_text()))

    transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING])

    job = wait_status(job, JobStatus.STOPPED, timeout=TEST_STOP_GRACE_SECONDS + 20)
    assert "SIGKILL" in stored_text(f"{job.output_uri}/logs/launcher-node-0.log")
    # Generous: on a loaded 2-core machine the kill lands late, but it must land.
    wait_for(lambda: process_gone(child.pid), timeout=20, message="the SIGTERM-ignoring child to be gone")
    assert_worker_runs_a_good_job(make_job)


def test_allocating_until_killed_fails_with_out_of_memory(node, make_job):
    job = make_job(script="allocate_forever.py",
                   resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1, "memory_limit_mb": 300})

    job = run_to_end(job)

    assert job.status == JobStatus.FAILED
    assert job.failure_reason.startswith("OutOfMemory: the job's processes used ")
    assert "over the limit of 300 MiB" in job.failure_reason
    assert_worker_runs_a_good_job(make_job)


def test_the_worker_process_survives_every_bad_job(node, node_worker):
    assert node_worker.alive()
    assert os.getpgid(node_worker.process.pid) != os.getpgrp()


def test_a_worker_asked_to_stop_ends_its_job_and_says_why(node, node_worker, make_job, isolated_storage, tmp_path):
    """SIGTERM to a node worker mid-job: its shutdown handler sets the flag, the agent
    ends the job's processes and records why, then the worker exits cleanly."""
    worker = start_worker(f"test-node-term-{uuid.uuid4().hex[:6]}", node_env(isolated_storage, tmp_path / "data"),
                          tmp_path / "worker.log")
    try:
        Node.objects.filter(pk=node.pk).update(state=NodeState.BUSY)  # keep the session's worker out of it
        register_node(name=worker.name, instance_type="cpu", pid=worker.process.pid)
        pid_file = tmp_path / "child.pid"
        job = make_job(script="ignore_sigterm_child.py", hyperparameters={"pid-file": str(pid_file)})
        assert job.pk in schedule_jobs()
        wait_for(pid_file.exists, timeout=30, message="the job's processes to start")

        assert stop_worker(worker) == 0, worker.log()[-3000:]

        job = wait_status(job, JobStatus.FAILED, timeout=20)
        assert job.failure_reason.startswith(f"infrastructure error: node {worker.name} was shut down while the job ran")
        child_pid = int(pid_file.read_text())
        wait_for(lambda: process_gone(child_pid), timeout=20, message="the job's SIGTERM-ignoring child to be gone")
        assert Node.objects.get(name=worker.name).state == NodeState.STOPPED
    finally:
        stop_worker(worker)
        Node.objects.filter(pk=node.pk).update(state=NodeState.IDLE)


def process_gone(pid: int) -> bool:
    """Ended (a zombie has ended too; its new parent reaps it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
