"""Metrics on the studio side: the flusher that writes the SDK's Redis streams to the
database (ingest), the downsampled and raw history reads (downsample), the live
server-sent events (live) and the log history reads (logs).

The flow (docs/SPEC.md §4): trainyard.log_metric → Redis stream per job →
flusher → MetricPoint rows (unique on job, name, step, rank) and their M4 rollups
(MetricChunk, rollups) → API; the SSE endpoint tails the same streams for live charts."""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Iterator
from typing import Any

import redis
from django.conf import settings
from django.db import connection, transaction

STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


@functools.cache
def metrics_redis() -> redis.Redis:
    """A client for blocking stream reads: its socket timeout outlasts any XREAD BLOCK we
    issue (the shared studio client's 5 s would cut a long block short)."""
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=30, health_check_interval=30)


def stream_items(reply: Any) -> list[tuple[Any, list[Any]]]:
    """[(stream key, entries)] from an XREAD/XREADGROUP reply, which redis-py gives as a
    list (RESP2) or a dict (RESP3)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        # RESP3 wraps each stream's entries in one more list.
        return [(k, v[0] if v and isinstance(v[0], list) else v) for k, v in reply.items()]
    return [(k, v) for k, v in reply]


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN or Infinity (DRF and browsers refuse them): report them as null."""
    return value if math.isfinite(value) else None


def parse_number(raw: Any) -> float | None:
    """A JSON number from a stream field, or None for "" and garbage."""
    if raw in (None, b"", ""):
        return None
    try:
        return float(raw)
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def series_index_plans() -> Iterator[None]:
    """Make PostgreSQL read one series through the unique (job, name, step, rank) index.

    A new job's rows are not in the planner's statistics yet (estimate: 1 row), so for
    `… WHERE job_id = ? AND name = ? ORDER BY step LIMIT n` it may pick the foreign
    key's plain job_id index and sort every row of the job: O(points) for what should be
    one index probe. Discouraging sorts, for these statements only, leaves the ordered
    index as the cheap plan."""
    if connection.vendor != "postgresql":
        yield
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute("SET LOCAL jit = off")
        try:
            yield
        finally:
            if not connection.needs_rollback:
                cursor.execute("SET LOCAL enable_sort = on")
