"""The flusher: Redis streams → MetricPoint/SystemMetric rows, at least once and
idempotently. Real Redis and the real database (PostgreSQL when DATABASE_URL is set)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection

from jobs.metrics import metrics_redis
from jobs.metrics.ingest import ENTRY_BUDGET, FLUSHER_GROUP, Flusher, install_stop_handlers, job_keys, run_flusher
from jobs.models import JobStatus, MetricChunk, MetricPoint, SystemMetric, TrainingJob
from tests import factories
from tests.conftest import ROOT, wait_for, worker_env
from tests.jobs.test_metric_rollups import assert_chunks_match
from trainyard.metrics import MetricsLogger
from trainyard.protocol import ACTIVE_METRIC_JOBS, EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key


def clear_streams(job_id: int) -> None:
    client = metrics_redis()
    client.delete(*(key(t, job_id) for t in (METRICS_STREAM, SYSTEM_STREAM, LOGS_STREAM, EVENTS_STREAM)))
    client.srem(ACTIVE_METRIC_JOBS, job_id)


@pytest.fixture
def make_job(project):
    made: list[int] = []

    def make(**overrides) -> TrainingJob:
        job = factories.make_job(project, **{"status": JobStatus.TRAINING, **overrides})
        clear_streams(job.pk)  # ids restart per test database; a stream may outlive its run
        made.append(job.pk)
        return job

    yield make
    for job_id in made:
        clear_streams(job_id)


def send(job_id: int, points: list[list], rank: int = 0) -> None:
    """One SDK-shaped entry: many points, packed."""
    metrics_redis().xadd(key(METRICS_STREAM, job_id), {"r": str(rank), "p": json.dumps(points)})
    metrics_redis().sadd(ACTIVE_METRIC_JOBS, job_id)


def drain(flusher: Flusher) -> int:
    handled = 0
    for _ in range(100):
        handled += flusher.flush_once(block_ms=0)
        if flusher.last_entries == 0:
            return handled
    raise AssertionError("the flusher did not catch up")


def pending(job_id: int) -> int:
    return metrics_redis().xpending(key(METRICS_STREAM, job_id), FLUSHER_GROUP)["pending"]


def series(job: TrainingJob, name: str = "loss", rank: int = 0) -> list[tuple[int, float]]:
    return list(MetricPoint.objects.filter(job=job, name=name, rank=rank).order_by("step").values_list("step", "value"))


def test_sdk_points_are_written_with_final_metrics_of_rank_0(make_job):
    job = make_job()
    for rank in (0, 1):
        logger = MetricsLogger(job.pk, settings.REDIS_URL, rank=rank)
        for step in range(2500):
            logger.log_metrics({"loss": 10.0 - step / 1000 - rank, "acc": step / 2500}, step)
        assert logger.flush(10)

    flusher = Flusher(discover_running=False)
    assert drain(flusher) >= 2 * 2 * 2500  # plus whatever other tests left in a shared Redis
    assert MetricPoint.objects.filter(job=job).count() == 10_000
    assert series(job, rank=1)[-1] == (2499, pytest.approx(10.0 - 2.499 - 1))
    job.refresh_from_db()
    assert job.final_metrics == {"loss": pytest.approx(10.0 - 2.499), "acc": pytest.approx(2499 / 2500)}
    assert pending(job.pk) == 0, "acked after the commit"


def test_the_same_entries_delivered_twice_leave_no_duplicates(make_job):
    job = make_job()
    batch = [["loss", step, step * 0.5, 1_700_000_000.0 + step] for step in range(300)]
    send(job.pk, batch)
    flusher = Flusher(discover_running=False)
    drain(flusher)
    send(job.pk, batch)  # a re-sent batch (a retry after a lost reply, a resumed run)
    send(job.pk, batch)
    drain(flusher)
    assert MetricPoint.objects.filter(job=job).count() == 300
    assert series(job)[:3] == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_a_resent_point_replaces_value_and_time(make_job):
    job = make_job()
    send(job.pk, [["loss", 5, 1.0, 1_700_000_000.0]])
    flusher = Flusher(discover_running=False)
    drain(flusher)
    # Re-sent twice more, both in the next batch: the later one wins.
    send(job.pk, [["loss", 5, 2.0, 1_700_000_100.0], ["loss", 6, 6.0, 1_700_000_100.0]])
    send(job.pk, [["loss", 5, 3.0, 1_700_000_200.0]])
    drain(flusher)
    point = MetricPoint.objects.get(job=job, name="loss", step=5, rank=0)
    assert point.value == 3.0 and point.time.timestamp() == 1_700_000_200.0
    job.refresh_from_db()
    assert job.final_metrics == {"loss": 6.0}, "the highest step, not the latest write"


def test_pending_entries_of_a_crashed_flusher_are_claimed_by_the_next(make_job):
    job = make_job()
    send(job.pk, [["loss", step, 1.0, 1_700_000_000.0] for step in range(50)])
    crashed = Flusher(consumer="crashed", discover_running=False)
    crashed._ensure_groups([job.pk])
    assert crashed._read([job.pk], block_ms=0), "read, then died before writing and acking"
    assert pending(job.pk) == 1 and MetricPoint.objects.filter(job=job).count() == 0

    successor = Flusher(consumer="successor", claim_idle_ms=0, discover_running=False)
    drain(successor)
    assert MetricPoint.objects.filter(job=job).count() == 50
    assert pending(job.pk) == 0


def test_a_restarted_flusher_rereads_its_own_pending_entries(make_job):
    job = make_job()
    send(job.pk, [["loss", 1, 1.0, 1_700_000_000.0]])
    first = Flusher(consumer="same-name", discover_running=False)
    first._ensure_groups([job.pk])
    first._recovering = False
    assert first._read([job.pk], block_ms=0)
    restarted = Flusher(consumer="same-name", discover_running=False)  # claim_idle_ms: not yet stale
    drain(restarted)
    assert series(job) == [(1, 1.0)] and pending(job.pk) == 0


def test_points_of_a_deleted_job_are_acked_and_dropped(make_job, caplog):
    job = make_job()
    keep = make_job(name="kept")
    send(job.pk, [["loss", step, 1.0, 1_700_000_000.0] for step in range(10)])
    send(keep.pk, [["loss", 1, 1.0, 1_700_000_000.0]])
    job_id = job.pk
    job.delete()
    flusher = Flusher(discover_running=False)
    with caplog.at_level(logging.WARNING, logger="jobs.metrics.ingest"):
        drain(flusher)
    assert flusher.dropped == 10
    assert f"dropped 10 points/samples of jobs that no longer exist: [{job_id}]" in caplog.text
    assert pending(job_id) == 0, "acked, so the stream is not stuck on them"
    # No foreign key in the database any more: the flusher's own check kept them out.
    assert not MetricPoint.objects.filter(job_id=job_id).exists()
    assert not MetricChunk.objects.filter(job_id=job_id).exists()
    assert series(keep) == [(1, 1.0)], "the rest of the batch is written"
    assert MetricChunk.objects.filter(job=keep).values_list("count", flat=True).get() == 1
    flusher.retire_finished([job_id])
    assert not metrics_redis().sismember(ACTIVE_METRIC_JOBS, job_id)


def test_malformed_points_are_dropped_and_the_good_ones_written(make_job):
    job = make_job()
    send(job.pk, [["loss", 1, 1.0, 1_700_000_000.0], ["x" * 300, 2, 1.0, 1_700_000_000.0],
                  ["loss", "three", 1.0, 1_700_000_000.0], ["loss", 4], ["loss", 5, 5.0, 1_700_000_000.0]])
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": "not json"})
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"p": "[]"})  # no rank
    # Brackets nested past any parser's depth (json's recursion, PostgreSQL's stack).
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": "[" * 100_000})
    flusher = Flusher(discover_running=False)
    drain(flusher)
    assert series(job) == [(1, 1.0), (5, 5.0)]
    # Well-formed but as deep: PostgreSQL refuses it with "stack depth limit exceeded".
    metrics_redis().xadd(key(METRICS_STREAM, job.pk), {"r": "0", "p": "[" * 100_000 + "]" * 100_000})
    send(job.pk, [["loss", 6, 6.0, 1_700_000_000.0]])
    drain(flusher)
    assert series(job) == [(1, 1.0), (5, 5.0), (6, 6.0)]
    assert pending(job.pk) == 0


def test_non_finite_values_do_not_break_a_batch(make_job):
    job = make_job()
    logger = MetricsLogger(job.pk, settings.REDIS_URL)
    logger.log_metric("loss", 1.0, 1)
    logger.log_metric("loss", float("nan"), 2)
    logger.log_metric("loss", float("inf"), 3)
    assert logger.flush(10)
    drain(Flusher(discover_running=False))
    stored = dict(series(job))
    assert stored[1] == 1.0 and stored[3] == math.inf
    if connection.vendor == "postgresql":
        assert math.isnan(stored[2])
    else:
        assert 2 not in stored, "SQLite cannot store NaN: skipped"
    job.refresh_from_db()
    assert job.final_metrics == {"loss": None}, "JSON has no Infinity: reported as null"


def test_system_samples_are_written_once_even_when_redelivered(make_job):
    job = make_job()
    sample = {"n": "node-1", "t": "1700000000.5", "cpu": "42.5", "mem": "1073741824", "gpu": "", "gpu_mem": ""}
    metrics_redis().xadd(key(SYSTEM_STREAM, job.pk), sample)
    flusher = Flusher(discover_running=True)  # a running job is found without the SDK's set
    drain(flusher)
    metrics_redis().xadd(key(SYSTEM_STREAM, job.pk), sample)  # the same sample again
    drain(flusher)
    rows = list(SystemMetric.objects.filter(job=job).values_list("node_name", "cpu_percent", "memory_bytes", "gpu_percent"))
    assert rows == [("node-1", 42.5, 1073741824, None)]


def test_a_finished_drained_job_leaves_the_active_set(make_job):
    job = make_job()
    send(job.pk, [["loss", 1, 1.0, 1_700_000_000.0]])
    flusher = Flusher(discover_running=False)
    drain(flusher)
    flusher.retire_finished([job.pk])
    assert metrics_redis().sismember(ACTIVE_METRIC_JOBS, job.pk), "still training: still watched"

    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    send(job.pk, [["loss", 2, 2.0, 1_700_000_000.0]])  # the last points, after the status change
    flusher.retire_finished([job.pk])
    assert metrics_redis().sismember(ACTIVE_METRIC_JOBS, job.pk), "not drained yet: kept"
    drain(flusher)
    flusher.retire_finished([job.pk])
    assert not metrics_redis().sismember(ACTIVE_METRIC_JOBS, job.pk)
    assert series(job) == [(1, 1.0), (2, 2.0)]
    assert 0 < metrics_redis().ttl(job_keys(job.pk)[0]) <= 24 * 3600, "the streams expire later"


def test_sigterm_handler_sets_the_stop_flag_and_the_loop_drains(make_job):
    job = make_job()
    stop = threading.Event()
    previous = install_stop_handlers(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(stop.is_set, timeout=5, message="the SIGTERM handler")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    send(job.pk, [["loss", step, 1.0, 1_700_000_000.0] for step in range(20)])
    # Stop already set: only the drain runs (on this thread: the test's transaction).
    run_flusher(stop, flusher=Flusher(discover_running=False), writers=1)
    assert len(series(job)) == 20


def test_pipelined_writers_keep_send_order_for_resent_points(transactional_db, project, monkeypatch):
    # Three entries per batch: ~14 batches, each overlapping the next on two connections.
    monkeypatch.setitem(ENTRY_BUDGET, connection.vendor, 3)
    job = TrainingJob.objects.create(project=project, name="piped", status=JobStatus.TRAINING)
    clear_streams(job.pk)
    try:
        # Forty entries; every one re-sends step 0 and the previous entry's last step.
        for entry in range(40):
            points = [["loss", step, float(entry), 1_700_000_000.0 + entry] for step in range(entry * 100, entry * 100 + 100)]
            points += [["loss", 0, float(entry), 1_700_000_000.0 + entry]]
            if entry:
                points += [["loss", entry * 100 - 1, -float(entry), 1_700_000_000.0 + entry]]
            send(job.pk, points)
        stop = threading.Event()
        stop.set()
        run_flusher(stop, flusher=Flusher(discover_running=False), writers=2, drain_seconds=60)
        stored = dict(series(job))
        assert len(stored) == 4000
        assert stored[0] == 39.0, "the last-sent value of a point written by every batch"
        assert all(stored[entry * 100 - 1] == -float(entry) for entry in range(1, 40))
        job.refresh_from_db()
        assert job.final_metrics == {"loss": 39.0}
        # Overlapping batches on two connections: merges and recomputes of shared chunks
        # wait for each other, so the rollups still equal the raw points.
        assert_chunks_match(job.pk)
    finally:
        clear_streams(job.pk)


@pytest.mark.slow
def test_flusher_command_writes_points_and_drains_on_sigterm(transactional_db, project, isolated_storage, tmp_path):
    job = TrainingJob.objects.create(project=project, name="cmd", status=JobStatus.TRAINING)
    clear_streams(job.pk)
    log_path = tmp_path / "flusher.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen([sys.executable, "manage.py", "studio", "flusher", "--block-ms", "200"], cwd=ROOT,
                                   env=worker_env(isolated_storage), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        send(job.pk, [["loss", step, 1.0, 1_700_000_000.0] for step in range(100)])
        wait_for(lambda: MetricPoint.objects.filter(job=job).count() == 100, timeout=60, message="the flusher's writes")
        send(job.pk, [["loss", step, 2.0, 1_700_000_000.0] for step in range(100, 5100)])
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        clear_streams(job.pk)
    output = log_path.read_text()
    assert "SIGTERM received" in output and "flusher: stopped" in output, output
    assert MetricPoint.objects.filter(job=job).count() == 5100, "points sent just before SIGTERM were drained"


def test_flusher_is_a_child_of_studio_up():
    from trainyard_site.management.commands.studio import _child_specs

    specs = _child_specs(host="127.0.0.1", port=8000, nodes=1, env={})
    flusher = next(spec for spec in specs if spec.name == "flusher")
    assert flusher.argv[-2:] == ["studio", "flusher"]
    assert time.time() > 0  # keeps `time` honest for readers: no sleeps in these tests
