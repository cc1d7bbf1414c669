"""A delete interrupted by killing the worker leaves nothing half-deleted, and a rerun
completes it (docs/SPEC.md §6, deleting): the rows go in one transaction together with the intent
(PendingDeletion and its URIs); a real control worker removes the store objects one URI at
a time and is killed with SIGKILL midway; a fresh worker's sweep finishes the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from datasets.storage import default_store, object_uri, split_uri
from jobs.models import JobStatus, MetricPoint, TrainingJob
from studio.models import PendingDeletion
from tests.conftest import ROOT, wait_for, worker_env
from tuning.models import TuningJob, TuningStatus

pytestmark = pytest.mark.slow

TRIALS = 24
FILES_PER_TRIAL = 60


def _start_worker(isolated_storage, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", isolated_storage["queue"], "-c", "1",
             "--pool", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "INFO"],
            cwd=ROOT, env=worker_env(isolated_storage), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, timeout=60, message="worker ready")
    assert proc.poll() is None, log.read_text()
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _local_path(uri: str) -> Path:
    return Path(split_uri(uri)[2])


@pytest.fixture
def big_search(project, owner) -> tuple[TuningJob, list[str]]:
    """A finished search of TRIALS trials, each with FILES_PER_TRIAL stored files."""
    tuning = TuningJob.objects.create(project=project, name="big-sweep", status=TuningStatus.COMPLETED, base_job={},
                                      parameter_ranges={}, objective={"metric": "loss", "goal": "minimize"},
                                      strategy="random", max_trials=TRIALS, max_parallel=1, created_by=owner)
    prefixes = []
    for number in range(1, TRIALS + 1):
        job = TrainingJob.objects.create(project=project, name=f"big-sweep-{number}", status=JobStatus.COMPLETED,
                                         tuning_job=tuning, trial_number=number)
        job.output_uri = object_uri(f"jobs/{job.pk}")
        job.save(update_fields=["output_uri"])
        folder = _local_path(job.output_uri) / "checkpoints"
        folder.mkdir(parents=True)
        for index in range(FILES_PER_TRIAL):
            (folder / f"step-{index}.pt").write_bytes(b"w" * 64)
        prefixes.append(job.output_uri)
    assert default_store().exists(prefixes[0])
    return tuning, prefixes


def test_a_delete_interrupted_by_killing_the_worker_leaves_nothing_half_deleted(
        transactional_db, isolated_storage, client_for, owner, big_search, tmp_path):
    tuning, prefixes = big_search
    first = _start_worker(isolated_storage, tmp_path / "worker-1.log")
    trial_ids = list(TrainingJob.objects.filter(tuning_job=tuning).values_list("pk", flat=True))

    response = client_for(owner).delete(f"/api/v1/tuning-jobs/{tuning.pk}/")
    assert response.status_code == 204

    # 1. The rows went at once, in one transaction with the intent.
    assert not TuningJob.objects.filter(pk=tuning.pk).exists()
    assert not TrainingJob.objects.filter(pk__in=trial_ids).exists()
    assert not MetricPoint.objects.filter(job_id__in=trial_ids).exists()

    # 2. Kill the worker as soon as it has removed some of the objects, not all.
    def midway() -> list[str] | None:
        pending = PendingDeletion.objects.first()
        return pending.uris if pending is not None and 0 < len(pending.uris) < len(prefixes) else None

    left = wait_for(midway, timeout=30, interval=0.005, message="the deletion to be under way")
    _kill(first)
    pending = PendingDeletion.objects.get()
    left = pending.uris
    assert 0 < len(left) < len(prefixes), "the worker was killed midway"

    # 3. Nothing half-deleted: every URI the intent no longer lists is gone entirely, every
    # one it lists but the first (the one in progress) is still whole.
    done = [p for p in prefixes if p not in left]
    assert done and not any(_local_path(p).exists() for p in done)
    for prefix in left[1:]:
        assert len(list((_local_path(prefix) / "checkpoints").iterdir())) == FILES_PER_TRIAL
    assert pending.attempts == 1

    # 4. A rerun completes it: a fresh worker's sweep picks up the intent nobody touches.
    from studio.tasks import sweep_pending_deletions_task

    second = _start_worker(isolated_storage, tmp_path / "worker-2.log")
    try:
        sweep_pending_deletions_task.delay(0)
        wait_for(lambda: not PendingDeletion.objects.exists(), timeout=120, message="the sweep to finish the deletion")
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(15)
    assert not any(_local_path(p).exists() for p in prefixes)
    # And the kill left the first worker's message unacknowledged: a redelivery later finds
    # no intent and does nothing (run_deletion of a missing row is a no-op).
    from studio.deletion import run_deletion

    assert run_deletion(pending.pk) == 0
