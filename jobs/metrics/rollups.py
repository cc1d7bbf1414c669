"""Pre-aggregated M4 rollups of metric series: MetricChunk rows.

A chunk is the points of one series (job, name, rank) whose step >> CHUNK_BITS is the
same: how many, the first and last point, and the points holding the minimum and the
maximum value (the earliest such step on ties, NaN ignored). That is exactly what M4
keeps of a bucket, and chunks merge into wider buckets without loss: a bucket's first is
its first chunk's first, its minimum the smallest of its chunks' minima. So a chart of a
1,000,000-point series is drawn from ~4,000 chunk rows instead of a million points, and
no single-step spike can fall out (jobs.metrics.downsample.read_series).

Why by step range, not by point count: the chunk of a point is known from its step
alone, so the flusher can merge a batch into the stored chunks with one upsert and no
per-series state. A series logged every k steps has 2^CHUNK_BITS / k points per chunk;
the rollup pays off as long as that is well above 4.

Maintenance (jobs.metrics.store, in the transaction that writes the points):
- new points only: their per-chunk summary is merged into the stored chunk (count adds
  up; first/last/min/max by comparison) — `merge_sql` on PostgreSQL, `merge_chunks` on
  SQLite;
- a point replaced with another value (a redelivery that differs, a resumed run
  re-logging its steps): the stored minimum or maximum may be the very value that went,
  so those chunks are recomputed from their raw points (≤ 2^CHUNK_BITS of them) —
  `recompute_sql` / `recompute_chunks`. A replaced point never adds to the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.models import MetricChunk, MetricPoint

# 256 steps per chunk: a 1M-point series is ~3,900 chunks, more than the widest chart asks
# for (MAX_POINTS / 4 = 2,500 buckets), so chunk-granular buckets never look coarser than
# the request, and reading them takes ~5 ms. The flusher's cost is the same at 256 and
# 1,024 steps (measured: ~75 ms per 100k points either way, the per-point aggregate
# dominates). Tests patch it smaller. Power of two: step >> bits is a floor division for
# negative steps too, in Python, numpy, PostgreSQL and SQLite alike.
CHUNK_BITS = 8
HALF_BITS = 26  # a step in two float8-exact halves, in SQL (see summary_sql)

IN_BATCH = 900
ChunkKey = tuple[int, str, int, int]  # (job, name, rank, chunk)
ChunkFields = dict[str, Any]  # MetricChunk field → value, CHUNK_FIELDS
CHUNK_FIELDS = ("count", "first_step", "first_value", "last_step", "last_value", "min_step", "min_value", "max_step",
                "max_value")


def chunk_steps() -> int:
    return 1 << CHUNK_BITS


def chunk_range(chunk: int) -> tuple[int, int]:
    """The first and last step a chunk can hold."""
    low = chunk << CHUNK_BITS
    return low, low + chunk_steps() - 1


@dataclass
class Chunks:
    """Summaries of consecutive chunks of one series, as parallel arrays in chunk order.
    min_value/max_value are NaN where every value of the chunk is NaN (then min_step and
    max_step hold the first step, and mean nothing)."""

    chunk: np.ndarray
    count: np.ndarray
    first_step: np.ndarray
    first_value: np.ndarray
    last_step: np.ndarray
    last_value: np.ndarray
    min_step: np.ndarray
    min_value: np.ndarray
    max_step: np.ndarray
    max_value: np.ndarray

    def __len__(self) -> int:
        return len(self.chunk)

    def take(self, index: np.ndarray | slice) -> Chunks:
        return Chunks(**{name: getattr(self, name)[index] for name in ("chunk", *CHUNK_FIELDS)})

    @staticmethod
    def concat(parts: Iterable[Chunks]) -> Chunks:
        parts = list(parts)
        return Chunks(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in ("chunk", *CHUNK_FIELDS)})

    def rows(self) -> list[tuple[int, ChunkFields]]:
        """(chunk, MetricChunk field values) per chunk; NaN extremes as null."""
        out = []
        for i in range(len(self)):
            fields: ChunkFields = {name: getattr(self, name)[i].item() for name in CHUNK_FIELDS}
            for extreme in ("min", "max"):
                if fields[f"{extreme}_value"] != fields[f"{extreme}_value"]:
                    fields[f"{extreme}_value"] = fields[f"{extreme}_step"] = None
            out.append((int(self.chunk[i]), fields))
        return out


def empty_chunks() -> Chunks:
    ints, floats = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return Chunks(ints, ints, ints, floats, ints, floats, ints, floats, ints, floats)


def first_per_group(hits: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of the indices `hits` (ascending), the first one of each group; returns (groups, indices)."""
    if not len(hits):
        return hits, hits
    groups = owner[hits]
    first = np.concatenate(([True], groups[1:] != groups[:-1]))
    return groups[first], hits[first]


def summarize(steps: np.ndarray, values: np.ndarray) -> Chunks:
    """Chunk summaries of one series' points (any order, no repeated step)."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if not len(steps):
        return empty_chunks()
    if len(steps) > 1 and not np.all(steps[1:] > steps[:-1]):
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
    chunk = steps >> CHUNK_BITS
    n = len(steps)
    starts = np.flatnonzero(np.concatenate(([True], chunk[1:] != chunk[:-1])))
    ends = np.append(starts[1:], n) - 1
    count = np.diff(np.append(starts, n))
    owner = np.repeat(np.arange(len(starts)), count)
    extremes = []
    for reduce in (np.fmin, np.fmax):  # fmin/fmax skip NaN (NaN only if all are)
        extreme = reduce.reduceat(values, starts)
        at = steps[starts].copy()
        groups, index = first_per_group(np.flatnonzero(values == extreme[owner]), owner)
        at[groups] = steps[index]
        extreme[groups] = values[index]  # the point's own value (-0.0 and 0.0 tie)
        extremes += [at, extreme]
    return Chunks(chunk[starts], count, steps[starts], values[starts], steps[ends], values[ends], *extremes)


def combine(stored: ChunkFields, new: ChunkFields) -> ChunkFields:
    """Merge the summary of new points (none of them stored yet) into a stored chunk:
    what merge_sql does on PostgreSQL. Ties keep the earlier step."""
    merged = {**stored, "count": stored["count"] + new["count"]}
    if new["first_step"] < stored["first_step"]:
        merged["first_step"], merged["first_value"] = new["first_step"], new["first_value"]
    if new["last_step"] > stored["last_step"]:
        merged["last_step"], merged["last_value"] = new["last_step"], new["last_value"]
    for extreme, sign in (("min", 1.0), ("max", -1.0)):
        value, step = new[f"{extreme}_value"], new[f"{extreme}_step"]
        old_value, old_step = stored[f"{extreme}_value"], stored[f"{extreme}_step"]
        if value is None:  # every new value is NaN
            continue
        if old_value is None or sign * value < sign * old_value or (value == old_value and step < old_step):
            merged[f"{extreme}_value"], merged[f"{extreme}_step"] = value, step
    return merged


# --- SQLite and other databases: in Python -----------------------------------------------
def merge_chunks(job_id: int, name: str, rank: int, new: Chunks) -> None:
    """Merge summaries of points that were all new into the stored chunks."""
    if not len(new):
        return
    rows = new.rows()
    numbers = [chunk for chunk, _ in rows]
    stored: dict[int, Mapping[str, Any]] = {}
    for start in range(0, len(numbers), IN_BATCH):  # SQLite's cap on host parameters
        stored.update({c["chunk"]: c for c in MetricChunk.objects.filter(
            job_id=job_id, name=name, rank=rank, chunk__in=numbers[start:start + IN_BATCH]).values()})
    objects = []
    for chunk, fields in rows:
        if chunk in stored:
            fields = combine({f: stored[chunk][f] for f in CHUNK_FIELDS}, fields)
        objects.append(MetricChunk(job_id=job_id, name=name, rank=rank, chunk=chunk, **fields))
    _save(objects)


def recompute_chunks(keys: set[ChunkKey]) -> None:
    """Summaries of these chunks from their raw points, replacing the stored ones."""
    by_series: dict[tuple[int, str, int], list[int]] = {}
    for job_id, name, rank, chunk in keys:
        by_series.setdefault((job_id, name, rank), []).append(chunk)
    objects: list[MetricChunk] = []
    for (job_id, name, rank), chunks in sorted(by_series.items()):
        parts = []
        for chunk in sorted(chunks):
            low, high = chunk_range(chunk)
            points = list(MetricPoint.objects.filter(job_id=job_id, name=name, rank=rank, step__gte=low, step__lte=high)
                          .values_list("step", "value"))
            if points:
                parts.append(summarize(np.array([p[0] for p in points]), np.array([p[1] for p in points])))
        objects += [MetricChunk(job_id=job_id, name=name, rank=rank, chunk=chunk, **fields)
                    for part in parts for chunk, fields in part.rows()]
    _save(objects)


def _save(objects: list[MetricChunk]) -> None:
    MetricChunk.objects.bulk_create(objects, batch_size=500, update_conflicts=True,
                                    unique_fields=["job", "name", "rank", "chunk"], update_fields=list(CHUNK_FIELDS))


# --- PostgreSQL: in SQL, from a relation of points -----------------------------------------
def summary_sql(points: str) -> str:
    """CTEs that end in `chunk_summary`: one row per (job_id, name, rank, chunk) of
    `points`, a relation of job_id, name, rank, step, value with no repeated key.

    One pass, one hash aggregate. PostgreSQL has no argmin, so each extreme is the min or
    max of an array that orders rows the way we need: [value, step] for the minimum
    (ties: the earlier step), [value, -step] for the maximum (ties: the earlier step),
    [step, value] for first and last. Arrays of float8, so a step rides as two exact
    halves (step >> 26, step & (2^26 - 1)): float8 alone would round steps above 2^53.
    A join back to the points to find those steps measured slower, and left the plan to
    the row estimates of a function scan (a merge join sorting the batch: +100 ms).
    NaN: PostgreSQL orders it above every number, so the extremes filter it out (null
    when every value is NaN), as numpy's fmin/fmax do."""
    bits = f"{CHUNK_BITS:d}"
    upper, lower = f"(step >> {HALF_BITS})::float8", f"(step & {(1 << HALF_BITS) - 1})::float8"

    def step_of(array: str, sign: str = "") -> str:  # the step in array[2:3]
        return f"(({sign}{array}[2])::bigint << {HALF_BITS}) + ({sign}{array}[3])::bigint"

    return f"""
chunk_arrays AS (
    SELECT job_id, name, rank, step >> {bits} AS chunk, count(*) AS count, min(step) AS first_step, max(step) AS last_step,
           min(ARRAY[{upper}, {lower}, value]) AS first_point, max(ARRAY[{upper}, {lower}, value]) AS last_point,
           min(ARRAY[value, {upper}, {lower}]) FILTER (WHERE value <> 'NaN') AS min_point,
           max(ARRAY[value, -{upper}, -{lower}]) FILTER (WHERE value <> 'NaN') AS max_point
    FROM {points} GROUP BY job_id, name, rank, step >> {bits}),
chunk_summary AS (
    SELECT job_id, name, rank, chunk, count, first_step, first_point[3] AS first_value, last_step,
           last_point[3] AS last_value, {step_of("min_point")} AS min_step, min_point[1] AS min_value,
           {step_of("max_point", "-")} AS max_step, max_point[1] AS max_value
    FROM chunk_arrays)"""


def _chunk_table() -> str:
    return MetricChunk._meta.db_table


def merge_sql(summary: str = "chunk_summary") -> str:
    """Upsert chunk summaries of NEW points (none of them stored before) into the stored
    chunks. Rows go in key order, so two writers lock shared chunks in the same order.
    SET expressions see the stored row as it was: ties keep the earlier step."""
    table = _chunk_table()
    return f"""
INSERT INTO {table} AS c (job_id, name, rank, chunk, count, first_step, first_value, last_step, last_value,
                          min_step, min_value, max_step, max_value)
SELECT job_id, name, rank, chunk, count, first_step, first_value, last_step, last_value, min_step, min_value, max_step,
       max_value
FROM {summary} ORDER BY job_id, name, rank, chunk
ON CONFLICT (job_id, name, rank, chunk) DO UPDATE SET
    count = c.count + EXCLUDED.count,
    first_step = LEAST(c.first_step, EXCLUDED.first_step),
    first_value = CASE WHEN EXCLUDED.first_step < c.first_step THEN EXCLUDED.first_value ELSE c.first_value END,
    last_step = GREATEST(c.last_step, EXCLUDED.last_step),
    last_value = CASE WHEN EXCLUDED.last_step > c.last_step THEN EXCLUDED.last_value ELSE c.last_value END,
    min_value = LEAST(c.min_value, EXCLUDED.min_value),
    min_step = CASE WHEN c.min_value IS NULL OR EXCLUDED.min_value < c.min_value
                      OR (EXCLUDED.min_value = c.min_value AND EXCLUDED.min_step < c.min_step)
                    THEN EXCLUDED.min_step ELSE c.min_step END,
    max_value = GREATEST(c.max_value, EXCLUDED.max_value),
    max_step = CASE WHEN c.max_value IS NULL OR EXCLUDED.max_value > c.max_value
                      OR (EXCLUDED.max_value = c.max_value AND EXCLUDED.max_step < c.max_step)
                    THEN EXCLUDED.max_step ELSE c.max_step END"""


def recompute_sql(keys: str) -> str:
    """Replace the chunks listed in the relation `keys` (job_id, name, rank, chunk) by
    summaries of their raw points, read through the unique (job, name, step, rank) index."""
    points, table = MetricPoint._meta.db_table, _chunk_table()
    columns = ", ".join(f"{field} = EXCLUDED.{field}" for field in CHUNK_FIELDS)
    return f"""
WITH raw_points AS MATERIALIZED (
    SELECT m.job_id, m.name, m.rank, m.step, m.value FROM {keys} k JOIN {points} m
      ON m.job_id = k.job_id AND m.name = k.name AND m.rank = k.rank
     AND m.step BETWEEN k.chunk << {CHUNK_BITS:d} AND (k.chunk << {CHUNK_BITS:d}) + {chunk_steps() - 1:d}),
{summary_sql("raw_points")}
INSERT INTO {table} (job_id, name, rank, chunk, count, first_step, first_value, last_step, last_value,
                     min_step, min_value, max_step, max_value)
SELECT job_id, name, rank, chunk, count, first_step, first_value, last_step, last_value, min_step, min_value, max_step,
       max_value
FROM chunk_summary ORDER BY job_id, name, rank, chunk
ON CONFLICT (job_id, name, rank, chunk) DO UPDATE SET {columns}"""


def lock_chunks_sql(keys: str) -> str:
    """Lock the stored chunks about to be recomputed, in key order. A concurrent writer
    that merged new points into one of them holds it until its commit: waiting here
    means the recompute (a later statement, so a later snapshot) sees those points."""
    return (f"SELECT 1 FROM {_chunk_table()} c JOIN {keys} k "  # noqa: S608
            "ON c.job_id = k.job_id AND c.name = k.name AND c.rank = k.rank AND c.chunk = k.chunk "
            "ORDER BY c.job_id, c.name, c.rank, c.chunk FOR UPDATE OF c")
