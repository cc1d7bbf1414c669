"""trainyard.log_metric inside a training process: non-blocking, bounded, never raising,
and losing nothing on a normal exit. Real Redis (REDIS_URL); no database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import redis

from studio.embedded_redis import EmbeddedRedis, free_port
from tests.conftest import ROOT, wait_for
from trainyard.metrics import MetricsLogger
from trainyard.protocol import ACTIVE_METRIC_JOBS, ENV_JOB_ID, ENV_REDIS_URL, METRICS_STREAM, key

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def job_id() -> int:
    # Far above any database id: these streams belong to no job row.
    return 10**12 + uuid.uuid4().int % 10**9


@pytest.fixture
def client(job_id: int):
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(key(METRICS_STREAM, job_id))
    yield client
    client.delete(key(METRICS_STREAM, job_id))
    client.srem(ACTIVE_METRIC_JOBS, job_id)
    client.close()


def stream_points(client: redis.Redis, job_id: int) -> list[tuple[int, list]]:
    return [(int(fields[b"r"]), point) for _, fields in client.xrange(key(METRICS_STREAM, job_id))
            for point in json.loads(fields[b"p"])]


def test_points_reach_the_job_stream_packed_with_their_rank(client, job_id):
    logger = MetricsLogger(job_id, REDIS_URL, rank=3)
    for step in range(12_000):
        logger.log_metric("loss", 1.0 / (step + 1), step)
    logger.log_metrics({"acc": 0.5, "lr": 1e-3}, step=12_000)
    assert logger.flush(10)

    entries = client.xrange(key(METRICS_STREAM, job_id))
    points = stream_points(client, job_id)
    assert len(points) == 12_002
    assert len(entries) < 12, "many points per XADD entry, not one entry per point"
    assert {rank for rank, _ in points} == {3}
    name, step, value, at = points[0][1]
    assert (name, step, value) == ("loss", 0, 1.0) and abs(at - time.time()) < 60
    assert [p[:3] for _, p in points if p[0] != "loss"] == [["acc", 12_000, 0.5], ["lr", 12_000, 1e-3]]
    # Each entry's points grouped by name (trainyard.protocol.metric_payload), each name's
    # in the order they were logged.
    for _, fields in entries:
        names = [point[0] for point in json.loads(fields[b"p"])]
        assert names == sorted(names)
    assert [p[1] for _, p in points if p[0] == "loss"] == list(range(12_000))
    assert client.sismember(ACTIVE_METRIC_JOBS, job_id), "the flusher learns where to look"


def test_sdk_never_raises_with_redis_down_and_keeps_a_bounded_buffer(job_id, capsys):
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    logger = MetricsLogger(job_id, closed, max_buffer=1000, flush_interval=0.01)
    started = time.perf_counter()
    for step in range(5000):
        logger.log_metric("loss", 0.1, step)
    assert time.perf_counter() - started < 1.0, "logging does not wait for Redis"
    wait_for(lambda: logger._backoff > 0, timeout=10, message="a failed send")

    assert logger.pending() <= 2 * 1000, "the buffer (plus one batch in flight) stays bounded"
    assert logger.dropped >= 5000 - 2 * 1000, "dropped points are counted"
    assert logger.flush(timeout=0.3) is False, "flush reports, does not raise"
    err = capsys.readouterr().err
    assert err.count("cannot send metrics to Redis") == 1, err


def test_buffered_points_are_sent_when_redis_comes_back(job_id):
    port = free_port()
    logger = MetricsLogger(job_id, f"redis://127.0.0.1:{port}/0", flush_interval=0.01)
    for step in range(100):
        logger.log_metric("loss", float(step), step)
    wait_for(lambda: logger._backoff > 0, timeout=10, message="a failed send")
    server = EmbeddedRedis(port=port)
    server.start()
    try:
        assert logger.flush(timeout=15)
        client = redis.Redis(port=port)
        assert [p[1] for _, p in stream_points(client, job_id)] == list(range(100)), "in order, none lost"
        client.close()
    finally:
        server.stop()


def test_bad_values_are_skipped_with_one_warning(job_id, capsys):
    logger = MetricsLogger(job_id, None)  # outside a job: kept in memory only
    logger.log_metric("loss", None, 1)  # type: ignore[arg-type]
    logger.log_metric("loss", "abc", 2)
    logger.log_metric("loss", 0.5, "three")  # type: ignore[arg-type]
    logger.log_metric("loss", 0.25, 4)
    assert [p[:3] for p in logger.recent()] == [("loss", 4, 0.25)]
    assert logger.rejected == 3
    assert capsys.readouterr().err.count("point skipped") == 1


def test_outside_a_job_points_stay_in_memory_and_nothing_is_sent():
    logger = MetricsLogger(None, None)
    for step in range(20_000):
        logger.log_metric("loss", 1.0, step)
    assert not logger.enabled and not logger._started, "no thread, no connection"
    assert len(logger.recent()) == 10_000 and logger.recent()[-1][1] == 19_999
    assert logger.flush(1) is True


def test_subprocess_logging_10000_points_then_exiting_loses_none(client, job_id):
    script = "from trainyard import log_metric\nfor step in range(10_000):\n    log_metric('loss', step / 10, step)\n"
    env = {**os.environ, ENV_JOB_ID: str(job_id), ENV_REDIS_URL: REDIS_URL, "RANK": "1"}
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=60)

    points = stream_points(client, job_id)
    assert sorted(p[1] for _, p in points) == list(range(10_000)), "the atexit flush sent every point"
    assert {rank for rank, _ in points} == {1}


def test_log_metric_median_cost_is_within_five_microseconds(client, job_id):
    logger = MetricsLogger(job_id, REDIS_URL)
    clock = time.perf_counter_ns
    costs = []
    for step in range(100_000):
        before = clock()
        logger.log_metric("loss", 0.5, step)
        costs.append(clock() - before)
    costs.sort()
    assert costs[len(costs) // 2] <= 5_000, f"median {costs[len(costs) // 2]} ns"
    assert logger.flush(10)
