"""The SDK sends a process's first metric point at once, not after its flush interval
(so a warm job's first metric is in the API within a second of its
submit; the interval used to add a fixed 100 ms). Later points are still batched.
Real Redis."""

from __future__ import annotations

import json
import time

from django.conf import settings

from studio.redis_conn import redis_client
from tests.conftest import wait_for
from trainyard.metrics import MetricsLogger
from trainyard.protocol import ACTIVE_METRIC_JOBS, METRICS_STREAM, key

JOB_ID = 987_654_321  # no database row needed: the SDK only talks to Redis


def test_the_first_point_leaves_at_once_and_the_next_ones_wait_for_the_interval():
    client = redis_client()
    stream = key(METRICS_STREAM, JOB_ID)
    client.delete(stream)
    logger = MetricsLogger(JOB_ID, settings.REDIS_URL, flush_interval=30.0)
    try:
        logger.log_metric("loss", 2.5, 0)
        entries = wait_for(lambda: client.xrange(stream), timeout=10, message="the first point in the job's stream")
        assert [json.loads(fields[b"p"])[0][:3] for _, fields in entries] == [["loss", 0, 2.5]]

        for step in range(1, 50):
            logger.log_metric("loss", 2.5 / step, step)
        time.sleep(1.0)
        assert len(client.xrange(stream)) == 1, "the rest waits for the flush interval, batched"
        assert logger.flush(10)
        points = [p for _, fields in client.xrange(stream) for p in json.loads(fields[b"p"])]
        assert [p[1] for p in points] == list(range(50)) and len(client.xrange(stream)) == 2
    finally:
        client.delete(stream)
        client.srem(ACTIVE_METRIC_JOBS, JOB_ID)
