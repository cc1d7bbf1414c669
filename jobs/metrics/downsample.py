"""Metric history for charts: a million points drawn from at most a few thousand, with
every spike kept.

M4 (Jugel et al., VLDB 2014): split the step axis into equal buckets (≈ pixel columns)
and keep, per bucket, the first and last point and the points with the minimum and the
maximum value. A line drawn through those is pixel-identical to one drawn through every
point, and — unlike uniform or random sampling — no single-step spike can fall out.

Reading the series is the expensive part, not the bucketing (0.4–0.75 s for 1M points on
PostgreSQL, however packed), so a long series is not read at all: `read_series` draws it
from its M4 rollups (MetricChunk, jobs.metrics.rollups — ~4,000 rows for 1M points),
merging adjacent chunks into buckets. That is M4 at chunk granularity: buckets end on
chunk boundaries instead of exactly at 1/n of the range, and every bucket's first, last,
minimum and maximum point are still real points of the series. A short series (or a
narrow step range) — up to RAW_THRESHOLD points — is read raw and bucketed exactly.

Raw reads: on PostgreSQL the (step, value) pairs come packed in one bytea straight into
numpy (no Python object per row); elsewhere through values_list. bench/metrics.py
measures both paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from django.db import connection, transaction

from jobs.metrics import rollups
from jobs.metrics.rollups import Chunks, empty_chunks, first_per_group, summarize
from jobs.models import MetricChunk, MetricPoint

DEFAULT_POINTS = 1000
MAX_POINTS = 10_000
# Up to this many points (counted from the chunks) a series is read raw and bucketed
# exactly: 20–40 ms on PostgreSQL. Above it, from the chunks: a few ms whatever the length.
RAW_THRESHOLD = 50_000

PACKED_POINT = np.dtype([("step", ">i8"), ("value", ">f8")])
PACKED_CHUNK = np.dtype([("chunk", ">i8"), ("count", ">i4"), ("first_step", ">i8"), ("first_value", ">f8"),
                         ("last_step", ">i8"), ("last_value", ">f8"), ("min_step", ">i8"), ("min_value", ">f8"),
                         ("max_step", ">i8"), ("max_value", ">f8")])


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
    packed = _fetch_packed(sql, params)
    if not packed:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    rows = np.frombuffer(packed, dtype=PACKED_POINT)
    steps, values = rows["step"].astype(np.int64), rows["value"].astype(np.float64)
    if len(steps) > 1 and not np.all(steps[1:] > steps[:-1]):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    return steps, values


def _fetch_packed(sql: str, params: list[object]) -> bytes | None:
    """The one bytea value `sql` selects, fetched in binary."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")  # JIT compiles this anew each time: tens of ms for nothing
        # A plain psycopg cursor (Django's binds client-side, which cannot ask for a binary
        # result): in text, 16 MB of bytea would arrive as 32 MB of hex to decode.
        import psycopg

        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
            raw.execute(sql, params, binary=True)
            result = raw.fetchone()
    return result[0] if result else None


def fetch_chunks(job_id: int, name: str, rank: int, *, min_step: int | None = None,
                 max_step: int | None = None) -> Chunks:
    """The stored chunks of one series that overlap [min_step, max_step], in order."""
    low = None if min_step is None else min_step >> rollups.CHUNK_BITS
    high = None if max_step is None else max_step >> rollups.CHUNK_BITS
    if connection.vendor == "postgresql":
        where = ["job_id = %s", "name = %s", "rank = %s"]
        params: list[object] = [job_id, name, rank]
        for bound, clause in ((low, "chunk >= %s"), (high, "chunk <= %s")):
            if bound is not None:
                where.append(clause)
                params.append(bound)
        # All-NaN chunks have no extremes: NaN values (the steps are then never read).
        fields = ("int8send(chunk) || int4send(count) || int8send(first_step) || float8send(first_value) || "
                  "int8send(last_step) || float8send(last_value) || int8send(coalesce(min_step, first_step)) || "
                  "float8send(coalesce(min_value, 'NaN')) || int8send(coalesce(max_step, first_step)) || "
                  "float8send(coalesce(max_value, 'NaN'))")
        packed = _fetch_packed(f"SELECT string_agg({fields}, ''::bytea ORDER BY chunk) "  # noqa: S608
                               f"FROM {MetricChunk._meta.db_table} WHERE {' AND '.join(where)}", params)
        if not packed:
            return empty_chunks()
        packed_rows = np.frombuffer(packed, dtype=PACKED_CHUNK)
        return Chunks(**{field: packed_rows[field].astype(np.float64 if field.endswith("value") else np.int64)
                         for field in ("chunk", *rollups.CHUNK_FIELDS)})
    query = MetricChunk.objects.filter(job_id=job_id, name=name, rank=rank)
    if low is not None:
        query = query.filter(chunk__gte=low)
    if high is not None:
        query = query.filter(chunk__lte=high)
    names = ("chunk", *rollups.CHUNK_FIELDS)
    rows = list(query.order_by("chunk").values_list(*names))
    if not rows:
        return empty_chunks()
    columns = dict(zip(names, zip(*rows, strict=True), strict=True))
    for extreme in ("min", "max"):  # null extremes (all NaN): as in the PostgreSQL branch
        columns[f"{extreme}_step"] = tuple(s if s is not None else f for s, f in zip(columns[f"{extreme}_step"],
                                                                                    columns["first_step"], strict=True))
        columns[f"{extreme}_value"] = tuple(math.nan if v is None else v for v in columns[f"{extreme}_value"])
    return Chunks(**{field: np.array(values, np.float64 if field.endswith("value") else np.int64)
                     for field, values in columns.items()})


def downsample_chunks(chunks: Chunks, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """M4 over chunk summaries: adjacent chunks merge into buckets (by the position of
    their first step on the step axis, as `downsample` buckets points) when there are
    more than max_points // 4 of them; each bucket keeps its first chunk's first point,
    its last chunk's last point, and the smallest minimum and largest maximum of its
    chunks (the earliest on ties; NaN ignored). At most max_points points, in step order."""
    n = len(chunks)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    buckets = max(1, max_points // 4)
    if n > buckets:
        low = float(chunks.first_step[0])
        span = float(chunks.last_step[-1]) - low + 1.0
        bucket = np.minimum(((chunks.first_step.astype(np.float64) - low) / span * buckets).astype(np.int64), buckets - 1)
        starts = np.flatnonzero(np.concatenate(([True], bucket[1:] != bucket[:-1])))
    else:
        starts = np.arange(n)
    ends = np.append(starts[1:], n) - 1
    owner = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    steps = [chunks.first_step[starts], chunks.last_step[ends]]
    values = [chunks.first_value[starts], chunks.last_value[ends]]
    for reduce, at, value in ((np.fmin, chunks.min_step, chunks.min_value), (np.fmax, chunks.max_step, chunks.max_value)):
        extreme = reduce.reduceat(value, starts)
        _, index = first_per_group(np.flatnonzero(value == extreme[owner]), owner)  # NaN == NaN is false: skipped
        steps.append(at[index])
        values.append(value[index])
    all_steps = np.concatenate(steps)
    unique, index = np.unique(all_steps, return_index=True)
    return unique, np.concatenate(values)[index]


def _clip_edges(chunks: Chunks, job_id: int, name: str, rank: int, min_step: int | None,
                max_step: int | None) -> Chunks:
    """Chunks that reach past the requested range are summarized again from their raw
    points inside it (at most two chunks' worth of points)."""
    edges = []
    if min_step is not None and chunks.first_step[0] < min_step:
        edges.append(0)
    if max_step is not None and chunks.last_step[-1] > max_step and len(chunks) - 1 not in edges:
        edges.append(len(chunks) - 1)
    if not edges:
        return chunks
    parts = []
    for i in range(len(chunks)):
        if i not in edges:
            parts.append(chunks.take(slice(i, i + 1)))
            continue
        low, high = rollups.chunk_range(int(chunks.chunk[i]))
        steps, values = fetch_series(job_id, name, rank, min_step=low if min_step is None else max(low, min_step),
                                     max_step=high if max_step is None else min(high, max_step))
        parts.append(summarize(steps, values))
    return Chunks.concat(parts)


def read_series(job_id: int, name: str, rank: int, max_points: int = DEFAULT_POINTS, *, min_step: int | None = None,
                max_step: int | None = None) -> Series:
    """At most max_points of the series in [min_step, max_step], M4-downsampled: from
    the chunks when the range holds more than RAW_THRESHOLD points, else from the raw
    points. A series without chunks (its points did not come through the flusher) is
    read raw whatever its length."""
    chunks = fetch_chunks(job_id, name, rank, min_step=min_step, max_step=max_step)
    if int(chunks.count.sum()) > RAW_THRESHOLD:
        chunks = _clip_edges(chunks, job_id, name, rank, min_step, max_step)
        total = int(chunks.count.sum())
        steps, values = downsample_chunks(chunks, max_points)
        return Series(name=name, rank=rank, steps=steps, values=values, total=total, downsampled=len(steps) < total)
    steps, values = fetch_series(job_id, name, rank, min_step=min_step, max_step=max_step)
    total = len(steps)
    small_steps, small_values = downsample(steps, values, max_points)
    return Series(name=name, rank=rank, steps=small_steps, values=small_values, total=total,
                  downsampled=len(small_steps) < total)
