"""Writing metric points and system samples to the database, for the flusher.

Points are upserted on (job, name, step, rank): a re-sent point replaces the stored one.
In the same transaction the series' M4 rollups (MetricChunk, jobs.metrics.rollups) are
brought up to date: merged with the summary of the new points, recomputed from the raw
points where a stored point changed value.

PostgreSQL gets the fast path (the SDK's JSON goes to the server as it is; one statement
inserts the points and merges their chunk summaries in the common case, an upsert only
when a point is already there); other databases work in Python with bulk_create.
bench/metrics.py measures it.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from django.db import DataError, IntegrityError, OperationalError, connection, transaction

from jobs.metrics import finite_or_none, rollups, series_index_plans
from jobs.models import MetricChunk, MetricPoint, SystemMetric, TrainingJob

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = MetricPoint._meta.get_field("name").max_length or 200
INT64_LIMIT = 2**63
SQLITE_IN_BATCH = 900  # host parameters per `step IN (...)` probe


@dataclass
class MetricEntry:
    """One SDK stream entry: many points of one rank, still as the JSON the SDK sent."""

    job_id: int
    rank: int
    payload: bytes  # JSON [[name, step, value, unix_time], ...]


Rows = dict[tuple[int, str, int, int], tuple[float, float]]  # (job, name, step, rank) → (value, unix time)
ENTRY_TABLE = "trainyard_metric_entries"
BATCH_TABLE = "trainyard_metric_batch"
KEY_TABLE = "trainyard_metric_chunk_keys"
NON_FINITE = re.compile(rb"(-?Infinity|NaN)")


def lock_existing_jobs(job_ids: set[int]) -> set[int]:
    """Which of these jobs exist: the one check per batch that replaces a foreign key on
    every point (MetricPoint.job has no database constraint; see the model).

    On PostgreSQL the rows are locked FOR KEY SHARE until the commit, as a foreign-key
    check would: a job being deleted right now is waited for, then seen as gone, and a
    delete that comes later waits for this batch. A delete whose points were already
    removed before this batch committed can still leave a few orphans behind; the
    flusher deletes them when it retires the job (delete_orphans)."""
    if not job_ids:
        return set()
    if connection.vendor != "postgresql":
        return set(TrainingJob.objects.filter(pk__in=job_ids).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {TrainingJob._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE",  # noqa: S608
                       [sorted(job_ids)])
        return {row[0] for row in cursor.fetchall()}


def delete_orphans(job_id: int) -> int:
    """Delete the points and chunks of a job that no longer exists."""
    if TrainingJob.objects.filter(pk=job_id).exists():
        return 0
    deleted, _ = MetricPoint.objects.filter(job_id=job_id).delete()
    MetricChunk.objects.filter(job_id=job_id).delete()
    return deleted


def write_points(entries: list[MetricEntry]) -> tuple[int, int]:
    """Write the entries' points (upsert) with their rollups and refresh final_metrics;
    inside the caller's transaction. Returns (points written, malformed points dropped)."""
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                written, names = _write_entries_postgres(entries)
            _update_final_metrics(names)
            return written, 0
        except (DataError, IntegrityError, OperationalError) as exc:
            # Bad data somewhere in the batch (a step that is not an integer, a name too
            # long, a payload that is not JSON, a short point, brackets nested past the
            # parser's stack: "stack depth limit exceeded", class 54): validate point by
            # point in Python and write what is good. Any other operational error (the
            # connection lost) is the caller's to retry.
            if isinstance(exc, OperationalError) and not _program_limit(exc):
                raise
            log.warning("batch refused by the fast path (%s); validating point by point", str(exc).splitlines()[0])
    rows, malformed = parse_entries(entries)
    if connection.vendor == "postgresql":
        _upsert_rows_postgres(rows)
    else:
        _upsert_rows_orm(rows)
    _update_final_metrics({(job_id, name) for job_id, name, _, rank in rows if rank == 0})
    return len(rows), malformed


def _program_limit(exc: OperationalError) -> bool:
    """PostgreSQL's class 54 (program limit exceeded: a statement too complex, a stack too deep)."""
    return str(getattr(exc.__cause__, "sqlstate", "") or "").startswith("54")


def parse_entries(entries: list[MetricEntry]) -> tuple[Rows, int]:
    """The entries' valid points, deduplicated (a later point wins: the stream is in send
    order), and how many points were malformed."""
    rows: Rows = {}
    malformed = 0
    for entry in entries:
        try:
            points = json.loads(entry.payload)
        except (ValueError, RecursionError):  # RecursionError: brackets nested past json's depth
            log.warning("job %s: an entry that is not JSON was dropped", entry.job_id)
            malformed += 1
            continue
        for point in points if isinstance(points, list) else [points]:
            try:
                name, step, value, unix_time = point
                if (type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH or type(step) is not int
                        or not -INT64_LIMIT <= step < INT64_LIMIT):
                    raise ValueError(name)
                rows[(entry.job_id, name, step, entry.rank)] = (float(value), float(unix_time))
            except (ValueError, TypeError):
                malformed += 1
    if malformed:
        log.warning("dropped %d malformed metric points", malformed)
    return rows, malformed


# --- PostgreSQL ---------------------------------------------------------------------------
def _create_temp_tables(cursor) -> None:  # noqa: ANN001 - a Django cursor wrapper
    """This connection's temporary tables, empty: created once per connection, in one
    statement (no "already exists" notice per batch). They empty themselves at commit;
    the DELETEs (free on empty tables) are for a caller that writes several batches in
    one transaction, as tests do. The entries' ~200 KB payloads are TOASTed, and by
    default compressed first: pglz cost ~80 ms per 100k points on data read once and
    thrown away, so they are stored out of line as they are (STORAGE EXTERNAL)."""
    cursor.execute(f"""DO $$ BEGIN
IF to_regclass('pg_temp.{ENTRY_TABLE}') IS NULL THEN
    CREATE TEMP TABLE {ENTRY_TABLE} (seq integer, job_id bigint, rank integer, payload jsonb) ON COMMIT DELETE ROWS;
    ALTER TABLE {ENTRY_TABLE} ALTER COLUMN payload SET STORAGE EXTERNAL;
    CREATE TEMP TABLE {BATCH_TABLE} (job_id bigint, name varchar(200), step bigint, rank integer, value double precision,
        t double precision, fresh boolean NOT NULL DEFAULT false) ON COMMIT DELETE ROWS;
    CREATE TEMP TABLE {KEY_TABLE} (job_id bigint, name varchar(200), rank integer, chunk bigint) ON COMMIT DELETE ROWS;
ELSE
    DELETE FROM {ENTRY_TABLE};
    DELETE FROM {BATCH_TABLE};
    DELETE FROM {KEY_TABLE};
END IF;
END $$""")
    # The statements below hash ~100k rows: keep that in memory, not in temporary files.
    cursor.execute("SET LOCAL work_mem = '64MB'")


# The points of the entries in ENTRY_TABLE, parsed by the server.
ENTRY_POINTS = (f"SELECT t.job_id, e.value->>0 AS name, (e.value->>1)::bigint AS step, t.rank, "
                f"(e.value->>2)::float8 AS value, (e.value->>3)::float8 AS t, t.seq, e.ordinality "
                f"FROM {ENTRY_TABLE} t, jsonb_array_elements(t.payload) WITH ORDINALITY e")


def _write_entries_postgres(entries: list[MetricEntry]) -> tuple[int, set[tuple[int, str]]]:
    """1. COPY the entries, JSON and all, into a temporary table: the server parses the
       JSON, so the flusher spends no Python time per point.
    2. One statement, the common case (nothing stored yet): INSERT every point and merge
       the batch's chunk summaries into the stored chunks. The JSON is parsed once
       (a materialized CTE) for both.
    3. Only if a point is already stored (a redelivery, a resumed run) or sent twice in
       the batch: roll that back and upsert (_upsert_batch_table), the latest-sent value
       winning.
    Returns (points written, the (job, name) pairs of rank 0 for final_metrics)."""
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        _create_temp_tables(cursor)
        # The raw psycopg cursor (for COPY) raises psycopg's errors: translate them to
        # Django's, which the callers catch.
        with connection.wrap_database_errors, cursor.cursor.copy(
                f"COPY {ENTRY_TABLE} (seq, job_id, rank, payload) FROM STDIN") as copy:
            for seq, entry in enumerate(entries):
                payload = entry.payload
                if b"NaN" in payload or b"Infinity" in payload:
                    # Python writes NaN/Infinity bare, which is not JSON; as strings they
                    # cast to float8 (a name containing them turns invalid: slow path).
                    payload = NON_FINITE.sub(rb'"\1"', payload)
                copy.write_row((seq, entry.job_id, entry.rank, payload.decode()))
        try:
            with transaction.atomic():
                cursor.execute(
                    f"WITH batch AS MATERIALIZED ({ENTRY_POINTS}), "  # noqa: S608
                    f"written AS (INSERT INTO {table} (job_id, name, step, rank, value, time) "
                    "SELECT job_id, name, step, rank, value, to_timestamp(t) FROM batch), "
                    f"{rollups.summary_sql('batch').strip()}, "
                    f"merged AS ({rollups.merge_sql().strip()} RETURNING c.job_id, c.name, c.rank) "
                    "SELECT DISTINCT job_id, name, rank, (SELECT count(*) FROM batch) FROM merged")
                series = cursor.fetchall()
            return (series[0][3] if series else 0), {(job_id, name) for job_id, name, rank, _ in series if rank == 0}
        except IntegrityError:
            cursor.execute(
                f"INSERT INTO {BATCH_TABLE} (job_id, name, step, rank, value, t) "  # noqa: S608
                f"SELECT DISTINCT ON (job_id, name, step, rank) job_id, name, step, rank, value, t FROM ({ENTRY_POINTS}) p "
                "ORDER BY job_id, name, step, rank, seq DESC, ordinality DESC")
            return _upsert_batch_table(cursor)


def _upsert_rows_postgres(rows: Rows) -> None:
    with connection.cursor() as cursor:
        _create_temp_tables(cursor)
        with connection.wrap_database_errors, cursor.cursor.copy(
                f"COPY {BATCH_TABLE} (job_id, name, step, rank, value, t) FROM STDIN") as copy:
            for (job_id, name, step, rank), (value, unix_time) in rows.items():
                copy.write_row((job_id, name, step, rank, value, unix_time))
        _upsert_batch_table(cursor)


def _upsert_batch_table(cursor) -> tuple[int, set[tuple[int, str]]]:  # noqa: ANN001 - a Django cursor wrapper
    """Upsert the deduplicated points in BATCH_TABLE and bring their chunks up to date.

    1. Insert what is not stored (ON CONFLICT DO NOTHING, which waits for a concurrent
       writer of the same key and then decides): what it returns is exactly the new
       points, marked `fresh`.
    2. Update the others where value or time differ; the chunks of the points it changed
       may have lost their minimum or maximum: they go to KEY_TABLE. A pure redelivery
       (same value, same time) changes nothing and costs no recompute.
    3. Merge the new points' summaries into the chunks that are not recomputed.
    4. Recompute the chunks in KEY_TABLE from their raw points, after locking them (see
       rollups.lock_chunks_sql)."""
    points, bits = MetricPoint._meta.db_table, rollups.CHUNK_BITS
    same_key = "m.job_id = b.job_id AND m.name = b.name AND m.step = b.step AND m.rank = b.rank"
    cursor.execute(
        f"WITH inserted AS (INSERT INTO {points} (job_id, name, step, rank, value, time) "  # noqa: S608
        f"SELECT job_id, name, step, rank, value, to_timestamp(t) FROM {BATCH_TABLE} ORDER BY job_id, name, step, rank "
        "ON CONFLICT (job_id, name, step, rank) DO NOTHING RETURNING job_id, name, step, rank) "
        f"UPDATE {BATCH_TABLE} b SET fresh = true FROM inserted m WHERE {same_key}")
    cursor.execute(
        f"WITH changed AS (UPDATE {points} m SET value = b.value, time = to_timestamp(b.t) FROM {BATCH_TABLE} b "  # noqa: S608
        f"WHERE NOT b.fresh AND {same_key} AND (m.value, m.time) IS DISTINCT FROM (b.value, to_timestamp(b.t)) "
        f"RETURNING m.job_id, m.name, m.rank, m.step >> {bits:d} AS chunk) "
        f"INSERT INTO {KEY_TABLE} SELECT DISTINCT job_id, name, rank, chunk FROM changed")
    recompute = cursor.rowcount
    cursor.execute(
        f"WITH fresh AS MATERIALIZED (SELECT job_id, name, rank, step, value FROM {BATCH_TABLE} b WHERE fresh "  # noqa: S608
        f"AND NOT EXISTS (SELECT 1 FROM {KEY_TABLE} k WHERE k.job_id = b.job_id AND k.name = b.name AND k.rank = b.rank "
        f"AND k.chunk = b.step >> {bits:d})), {rollups.summary_sql('fresh').strip()} {rollups.merge_sql().strip()}")
    if recompute:
        cursor.execute(rollups.lock_chunks_sql(KEY_TABLE))
        cursor.execute(rollups.recompute_sql(KEY_TABLE))
    cursor.execute(f"SELECT count(*) FROM {BATCH_TABLE}")  # noqa: S608
    written = cursor.fetchone()[0]
    cursor.execute(f"SELECT DISTINCT job_id, name FROM {BATCH_TABLE} WHERE rank = 0")  # noqa: S608
    return written, {(job_id, name) for job_id, name in cursor.fetchall()}


# --- SQLite and others --------------------------------------------------------------------
def _upsert_rows_orm(rows: Rows) -> None:
    """The same as _upsert_batch_table, in Python: look up which points are stored, write
    the new and the changed ones, merge the new points' chunk summaries, recompute the
    chunks where a stored point changed. SQLite has one writer at a time, so nothing
    changes between the lookup and the write."""
    by_series: dict[tuple[int, str, int], dict[int, tuple[float, float]]] = {}
    for (job_id, name, step, rank), (value, unix_time) in rows.items():
        if value != value:  # NaN: SQLite stores it as NULL, which the column refuses
            continue
        by_series.setdefault((job_id, name, rank), {})[step] = (value, unix_time)
    objects: list[MetricPoint] = []
    recompute: set[rollups.ChunkKey] = set()
    fresh: dict[tuple[int, str, int], list[int]] = {}
    for (job_id, name, rank), points in by_series.items():
        stored = _stored_points(job_id, name, rank, list(points))
        for step, (value, unix_time) in points.items():
            when = datetime.fromtimestamp(unix_time, tz=UTC)
            if step not in stored:
                fresh.setdefault((job_id, name, rank), []).append(step)
            elif stored[step] == (value, when):
                continue  # a pure redelivery: nothing to write
            else:
                recompute.add((job_id, name, rank, step >> rollups.CHUNK_BITS))
            objects.append(MetricPoint(job_id=job_id, name=name, step=step, rank=rank, value=value, time=when))
    MetricPoint.objects.bulk_create(objects, batch_size=2000, update_conflicts=True,
                                    unique_fields=["job", "name", "step", "rank"], update_fields=["value", "time"])
    for (job_id, name, rank), steps in fresh.items():
        steps = [s for s in steps if (job_id, name, rank, s >> rollups.CHUNK_BITS) not in recompute]
        values = [by_series[(job_id, name, rank)][s][0] for s in steps]
        rollups.merge_chunks(job_id, name, rank, rollups.summarize(np.array(steps, np.int64), np.array(values, np.float64)))
    rollups.recompute_chunks(recompute)


def _stored_points(job_id: int, name: str, rank: int, steps: list[int]) -> dict[int, tuple[float, datetime]]:
    stored: dict[int, tuple[float, datetime]] = {}
    series = MetricPoint.objects.filter(job_id=job_id, name=name, rank=rank)
    for start in range(0, len(steps), SQLITE_IN_BATCH):
        probe = series.filter(step__in=steps[start:start + SQLITE_IN_BATCH]).values_list("step", "value", "time")
        stored.update({step: (value, when) for step, value, when in probe})
    return stored


def _update_final_metrics(names: set[tuple[int, str]]) -> None:
    """final_metrics[name] = the rank-0 value at the highest step, read back from the
    table so that a late re-delivery of old steps cannot overwrite a newer value. The job
    row is locked first (FOR NO KEY UPDATE: the FOR KEY SHARE of lock_existing_jobs in
    a concurrent batch still passes), so two writers cannot each merge a stale view. One UPDATE per job."""
    by_job: dict[int, list[str]] = {}
    for job_id, name in names:
        by_job.setdefault(job_id, []).append(name)
    table = MetricPoint._meta.db_table
    # One "latest row" probe per name: an index scan backwards on (job, name, step, rank)
    # that stops at the first rank-0 row.
    probe = (f"SELECT * FROM (SELECT name, value FROM {table} WHERE job_id = %s AND name = %s AND rank = 0 "  # noqa: S608
             "ORDER BY step DESC LIMIT 1) AS latest")
    for job_id, job_names in sorted(by_job.items()):
        job = TrainingJob.objects.select_for_update(no_key=True).filter(pk=job_id).only("final_metrics").first()
        if job is None:
            continue
        latest: dict[str, float | None] = {}
        for start in range(0, len(job_names), 200):
            chunk = sorted(job_names)[start:start + 200]
            with series_index_plans(), connection.cursor() as cursor:
                cursor.execute(" UNION ALL ".join([probe] * len(chunk)), [p for name in chunk for p in (job_id, name)])
                latest.update({name: finite_or_none(value) for name, value in cursor.fetchall()})
        merged = {**(job.final_metrics or {}), **latest}
        if merged != job.final_metrics:
            TrainingJob.objects.filter(pk=job_id).update(final_metrics=merged)


def insert_samples(samples: list[SystemMetric]) -> None:
    """System samples have no natural unique key in the table; skip the ones a
    re-delivered entry already wrote (same job, node and time)."""
    by_job: dict[int, list[SystemMetric]] = {}
    for sample in samples:
        by_job.setdefault(sample.job_id, []).append(sample)
    fresh: list[SystemMetric] = []
    for job_id, group in by_job.items():
        times = [s.time for s in group]
        seen = set(SystemMetric.objects.filter(job_id=job_id, time__gte=min(times), time__lte=max(times))
                   .values_list("node_name", "time"))
        for sample in group:
            if (sample.node_name, sample.time) not in seen:
                seen.add((sample.node_name, sample.time))
                fresh.append(sample)
    SystemMetric.objects.bulk_create(fresh, batch_size=1000)
