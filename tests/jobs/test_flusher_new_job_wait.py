"""The flusher notices a job that just started within NEW_JOB_WAIT_MS, whatever its
`block_ms` (so a warm job's first metric is in the API within a second of
its submit). It used to wait out the whole block — 500 ms under `studio flusher` — on the
streams it already knew, or asleep when it knew none, before looking for new jobs.
Real Redis, real database."""

from __future__ import annotations

import json
import threading
import time

from jobs.metrics import metrics_redis
from jobs.metrics.ingest import NEW_JOB_WAIT_MS, Flusher
from jobs.models import JobStatus, MetricPoint, TrainingJob
from tests.conftest import wait_for
from tests.jobs.test_metrics_ingest import clear_streams
from trainyard.protocol import ACTIVE_METRIC_JOBS, METRICS_STREAM, key

BLOCK_MS = 500  # `studio flusher`'s default


def _job(project, name: str) -> TrainingJob:
    job = TrainingJob.objects.create(project=project, name=name, status=JobStatus.TRAINING)
    clear_streams(job.pk)
    return job


def _cycle_seconds(flusher: Flusher) -> float:
    """The shortest of three flush cycles with nothing to read."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        assert flusher.flush_once(block_ms=BLOCK_MS) == 0
        times.append(time.monotonic() - started)
    return min(times)


def test_a_flusher_with_nothing_to_read_looks_for_new_jobs_within_the_wait(db, project):
    assert NEW_JOB_WAIT_MS < BLOCK_MS
    flusher = Flusher(discover_running=False)
    metrics_redis().delete(ACTIVE_METRIC_JOBS)
    assert _cycle_seconds(flusher) < 0.8 * BLOCK_MS / 1000  # no job at all: it used to sleep the block

    quiet = _job(project, "quiet")
    metrics_redis().sadd(ACTIVE_METRIC_JOBS, quiet.pk)  # known, but sends nothing (it just ended)
    try:
        assert _cycle_seconds(flusher) < 0.8 * BLOCK_MS / 1000  # it used to block the whole block_ms on its streams
    finally:
        clear_streams(quiet.pk)


def test_a_new_jobs_first_point_is_written_while_the_flusher_waits_on_another_job(transactional_db, project):
    quiet, new = _job(project, "quiet"), _job(project, "new")
    client = metrics_redis()
    client.sadd(ACTIVE_METRIC_JOBS, quiet.pk)
    flusher = Flusher(discover_running=False)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            flusher.flush_once(block_ms=60_000)  # a block longer than the test: only the wait bounds it

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # the flusher is waiting on the quiet job's streams now
        client.xadd(key(METRICS_STREAM, new.pk), {"r": "0", "p": json.dumps([["loss", 0, 1.5, time.time()]])})
        client.sadd(ACTIVE_METRIC_JOBS, new.pk)
        wait_for(lambda: MetricPoint.objects.filter(job=new).exists(), timeout=20,
                 message="the new job's first point in the database")
    finally:
        stop.set()
        thread.join(30)
        clear_streams(quiet.pk)
        clear_streams(new.pk)
    assert not thread.is_alive()
