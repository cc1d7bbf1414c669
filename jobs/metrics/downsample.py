"""Metric history for charts: a million points drawn from at most a few thousand, with
every spike kept.

M4 (Jugel et al., VLDB 2014): split the step axis into equal buckets (≈ pixel columns)
and keep, per bucket, the first and last point and the points with the minimum and the
maximum value. A line drawn through those is pixel-identical to one drawn through every
point, and — unlike uniform or random sampling — no single-step spike can fall out.

Reading the series is the expensive part, not the bucketing: on PostgreSQL the (step,
value) pairs come packed in one bytea straight into numpy (no Python object per row);
elsewhere through values_list. bench/metrics.py measures both against fetching raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction

from jobs.models import MetricPoint

DEFAULT_POINTS = 1000
MAX_POINTS = 10_000

PACKED_POINT = np.dtype([("step", ">i8"), ("value", ">f8")])


@dataclass
class Series:
    name: str
    rank: int
    steps: np.ndarray  # int64, ascending
    values: np.ndarray  # float64
    total: int
    downsampled: bool

    def points(self) -> list[list[float | int | None]]:
        """[[step, value], ...] for JSON: non-finite values (NaN, ±inf) become null."""
        values = self.values.astype(object)
        values[~np.isfinite(self.values)] = None
        return [list(pair) for pair in zip(self.steps.tolist(), values.tolist(), strict=True)]


def downsample(steps: np.ndarray | list[int], values: np.ndarray | list[float], max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """M4 downsampling of a series sorted by step. Returns at most `max_points` points
    (the input itself when it is already small enough), always including the first and
    last point and each bucket's first, last, minimum and maximum. NaN values are skipped
    when finding a bucket's extremes."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    n = len(steps)
    if n <= max_points:
        return steps, values
    buckets = max(1, max_points // 4)
    low, span = steps[0], float(steps[-1] - steps[0]) + 1.0
    # Bucket by position on the step axis (what a chart's x axis shows), not by count, so
    # irregular logging intervals do not distort the picture. Floats: step × buckets could
    # overflow int64 for huge steps.
    bucket = np.minimum(((steps - low) / span * buckets).astype(np.int64), buckets - 1)
    starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    ends = np.append(starts[1:], n) - 1
    sizes = np.diff(np.append(starts, n))
    owner = np.repeat(np.arange(len(starts)), sizes)  # bucket number of every point
    keep = [starts, ends]
    # fmin/fmax ignore NaN; then the first index per bucket holding that value.
    for extreme in (np.fmin.reduceat(values, starts), np.fmax.reduceat(values, starts)):
        hits = np.flatnonzero(values == extreme[owner])
        first = np.concatenate(([True], owner[hits][1:] != owner[hits][:-1])) if len(hits) else np.zeros(0, bool)
        keep.append(hits[first])
    index = np.unique(np.concatenate(keep))
    return steps[index], values[index]


def fetch_series(job_id: int, name: str, rank: int, *, min_step: int | None = None,
                 max_step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one series in step order, as numpy arrays."""
    if connection.vendor == "postgresql":
        return _fetch_postgres(job_id, name, rank, min_step, max_step)
    rows = MetricPoint.objects.filter(job_id=job_id, name=name, rank=rank)
    if min_step is not None:
        rows = rows.filter(step__gte=min_step)
    if max_step is not None:
        rows = rows.filter(step__lte=max_step)
    pairs = list(rows.order_by("step").values_list("step", "value"))
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    steps, values = zip(*pairs, strict=True)
    return np.fromiter(steps, np.int64, len(steps)), np.fromiter(values, np.float64, len(values))


def _fetch_postgres(job_id: int, name: str, rank: int, min_step: int | None, max_step: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The whole series as one bytea of packed big-endian (int8, float8) pairs, built by
    the server: one value crosses the wire instead of a million rows (fetching rows, or
    iterating a COPY, costs Python work per point and is 3–8× slower here)."""
    table = MetricPoint._meta.db_table
    where = ["job_id = %s", "name = %s", "rank = %s"]
    params: list[object] = [job_id, name, rank]
    if min_step is not None:
        where.append("step >= %s")
        params.append(min_step)
    if max_step is not None:
        where.append("step <= %s")
        params.append(max_step)
    # No ORDER BY: the rows come in the heap's order (a bitmap scan, reading pages in
    # sequence), which is the order the points were written — step order, bar a resumed
    # run's re-sent steps. Sorting in numpy when needed is cheaper than reading the heap in
    # index order (measured: ~0.3 s vs ~0.55 s for 1M points).
    sql = (f"SELECT string_agg(int8send(step) || float8send(value), ''::bytea) "  # noqa: S608
           f"FROM {table} WHERE {' AND '.join(where)}")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")  # JIT compiles this anew each time: tens of ms for nothing
        # A plain psycopg cursor (Django's binds client-side, which cannot ask for a binary
        # result): in text, 16 MB of bytea would arrive as 32 MB of hex to decode.
        import psycopg

        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
            raw.execute(sql, params, binary=True)
            result = raw.fetchone()
    packed = result[0] if result else None
    if not packed:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    rows = np.frombuffer(packed, dtype=PACKED_POINT)
    steps, values = rows["step"].astype(np.int64), rows["value"].astype(np.float64)
    if len(steps) > 1 and not np.all(steps[1:] > steps[:-1]):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    return steps, values


def read_series(job_id: int, name: str, rank: int, max_points: int = DEFAULT_POINTS, *, min_step: int | None = None,
                max_step: int | None = None) -> Series:
    steps, values = fetch_series(job_id, name, rank, min_step=min_step, max_step=max_step)
    total = len(steps)
    small_steps, small_values = downsample(steps, values, max_points)
    return Series(name=name, rank=rank, steps=small_steps, values=small_values, total=total,
                  downsampled=len(small_steps) < total)
