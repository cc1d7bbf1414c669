"""Writing metric points and system samples to the database, for the flusher.

Points are upserted on (job, name, step, rank): a re-sent point replaces the stored one.
PostgreSQL gets the fast path (the SDK's JSON goes to the server as it is; a plain INSERT
in the common case, an upsert only when a point is already there); other databases use
bulk_create with update_conflicts. bench/metrics.py measures it.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import DataError, IntegrityError, connection, transaction

from jobs.metrics import finite_or_none, series_index_plans
from jobs.models import MetricPoint, SystemMetric, TrainingJob

log = logging.getLogger(__name__)

MAX_NAME_LENGTH = MetricPoint._meta.get_field("name").max_length or 200
INT64_LIMIT = 2**63


@dataclass
class MetricEntry:
    """One SDK stream entry: many points of one rank, still as the JSON the SDK sent."""

    job_id: int
    rank: int
    payload: bytes  # JSON [[name, step, value, unix_time], ...]


Rows = dict[tuple[int, str, int, int], tuple[float, float]]  # (job, name, step, rank) → (value, unix time)
ENTRY_TABLE = "trainyard_metric_entries"
ROW_TABLE = "trainyard_metric_rows"
NON_FINITE = re.compile(rb"(-?Infinity|NaN)")


def write_points(entries: list[MetricEntry]) -> tuple[int, int]:
    """Write the entries' points (upsert) and refresh final_metrics; inside the caller's
    transaction. Returns (points written, malformed points dropped)."""
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                written, names = _write_entries_postgres(entries)
            _update_final_metrics(names)
            return written, 0
        except (DataError, IntegrityError) as exc:
            # Bad data somewhere in the batch (a step that is not an integer, a name too
            # long, a payload that is not JSON): validate point by point in Python and
            # write what is good. IntegrityError here is a NOT NULL (a short point), not a
            # foreign key: those are checked at commit.
            log.warning("batch refused by the fast path (%s); validating point by point", str(exc).splitlines()[0])
    rows, malformed = parse_entries(entries)
    if connection.vendor == "postgresql":
        _upsert_rows_postgres(rows)
    else:
        _upsert_rows_orm(rows)
    _update_final_metrics({(job_id, name) for job_id, name, _, rank in rows if rank == 0})
    return len(rows), malformed


def parse_entries(entries: list[MetricEntry]) -> tuple[Rows, int]:
    """The entries' valid points, deduplicated (a later point wins: the stream is in send
    order), and how many points were malformed."""
    rows: Rows = {}
    malformed = 0
    for entry in entries:
        try:
            points = json.loads(entry.payload)
        except ValueError:
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


def _write_entries_postgres(entries: list[MetricEntry]) -> tuple[int, set[tuple[int, str]]]:
    """1. COPY the entries, JSON and all, into a temporary table: the server parses the
       JSON, so the flusher spends no Python time per point.
    2. Plain INSERT of every point: the common case, nothing stored yet.
    3. Only if a point is already stored (a redelivery, a resumed run) or sent twice in
       the batch: roll that back and upsert, the latest-sent value winning.
    Returns (points written, the (job, name) pairs of rank 0 for final_metrics)."""
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {ENTRY_TABLE} (seq integer, job_id bigint, rank integer, "
                       "payload jsonb) ON COMMIT DELETE ROWS")
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
        points = (f"SELECT t.job_id, e.value->>0 AS name, (e.value->>1)::bigint AS step, t.rank, "
                  f"(e.value->>2)::float8 AS value, to_timestamp((e.value->>3)::float8) AS time, t.seq, e.ordinality "
                  f"FROM {ENTRY_TABLE} t, jsonb_array_elements(t.payload) WITH ORDINALITY e")
        try:
            with transaction.atomic():
                cursor.execute(f"INSERT INTO {table} (job_id, name, step, rank, value, time) "  # noqa: S608
                               f"SELECT job_id, name, step, rank, value, time FROM ({points}) p")
        except IntegrityError:
            cursor.execute(
                f"INSERT INTO {table} (job_id, name, step, rank, value, time) "  # noqa: S608
                f"SELECT DISTINCT ON (job_id, name, step, rank) job_id, name, step, rank, value, time FROM ({points}) p "
                "ORDER BY job_id, name, step, rank, seq DESC, ordinality DESC "
                "ON CONFLICT (job_id, name, step, rank) DO UPDATE SET value = EXCLUDED.value, time = EXCLUDED.time")
        written = cursor.rowcount
        cursor.execute(f"SELECT DISTINCT t.job_id, e.value->>0 FROM {ENTRY_TABLE} t, "  # noqa: S608
                       "jsonb_array_elements(t.payload) e WHERE t.rank = 0")
        names = {(job_id, name) for job_id, name in cursor.fetchall()}
    return written, names


def _upsert_rows_postgres(rows: Rows) -> None:
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {ROW_TABLE} (job_id bigint, name varchar(200), step bigint, "
                       "rank integer, value double precision, t double precision) ON COMMIT DELETE ROWS")
        with connection.wrap_database_errors, cursor.cursor.copy(
                f"COPY {ROW_TABLE} (job_id, name, step, rank, value, t) FROM STDIN") as copy:
            for (job_id, name, step, rank), (value, unix_time) in rows.items():
                copy.write_row((job_id, name, step, rank, value, unix_time))
        cursor.execute(
            f"INSERT INTO {table} (job_id, name, step, rank, value, time) "  # noqa: S608
            f"SELECT job_id, name, step, rank, value, to_timestamp(t) FROM {ROW_TABLE} "
            "ON CONFLICT (job_id, name, step, rank) DO UPDATE SET value = EXCLUDED.value, time = EXCLUDED.time")


def _upsert_rows_orm(rows: Rows) -> None:
    objects = []
    for (job_id, name, step, rank), (value, unix_time) in rows.items():
        if value != value:  # NaN: SQLite stores it as NULL, which the column refuses
            continue
        objects.append(MetricPoint(job_id=job_id, name=name, step=step, rank=rank, value=value,
                                   time=datetime.fromtimestamp(unix_time, tz=UTC)))
    MetricPoint.objects.bulk_create(objects, batch_size=2000, update_conflicts=True,
                                    unique_fields=["job", "name", "step", "rank"], update_fields=["value", "time"])


def _update_final_metrics(names: set[tuple[int, str]]) -> None:
    """final_metrics[name] = the rank-0 value at the highest step, read back from the
    table so that a late re-delivery of old steps cannot overwrite a newer value. The job
    row is locked first (FOR NO KEY UPDATE: foreign-key checks of concurrent inserts
    still pass), so two writers cannot each merge a stale view. One UPDATE per job."""
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
