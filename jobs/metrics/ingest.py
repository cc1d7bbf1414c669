"""The flusher: metric points and system samples from the jobs' Redis streams into the
database, in batches, idempotently.

    python manage.py studio flusher        # run_flusher() until SIGTERM

Delivery is at-least-once and the write is an upsert, so nothing is lost and nothing is
doubled:
- streams are read through a consumer group (FLUSHER_GROUP); an entry is XACKed only
  after the transaction that wrote it committed. A flusher that dies in between leaves
  the entry pending; the next one claims it (XAUTOCLAIM) and writes it again, which
  replaces the same rows (unique on job, name, step, rank).
- a re-sent point (a resumed run logging step 40 again) replaces value and time.
- points of a job that no longer exists are acked and dropped (logged), so a deleted job
  cannot wedge the stream. MetricPoint has no foreign key in the database (it cost a
  third of the write time): each batch checks its job ids once (lock_existing_jobs), and
  retiring a deleted job deletes any points that raced its delete (delete_orphans).

The writes themselves are in jobs.metrics.store; on PostgreSQL `run_flusher` overlaps one
batch's commit with the next batch's statements (WriterPool).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from django.db import IntegrityError, close_old_connections, connection, transaction

from jobs.metrics import metrics_redis, parse_number, stream_items, text
from jobs.metrics.store import MetricEntry, delete_orphans, insert_samples, lock_existing_jobs, parse_entries, write_points
from jobs.models import FINISHED_STATUSES, SystemMetric, TrainingJob
from trainyard.protocol import (
    ACTIVE_METRIC_JOBS,
    EVENTS_STREAM,
    FLUSHER_GROUP,
    LOGS_STREAM,
    METRICS_STREAM,
    SYSTEM_STREAM,
    key,
)

log = logging.getLogger(__name__)

# Stream entries read per batch across all streams. An SDK entry holds up to 5,000
# points, so 20 entries is ≤ 100,000 points per transaction on PostgreSQL. SQLite holds
# its one write lock for the whole transaction: smaller batches let other writers in.
ENTRY_BUDGET = {"postgresql": 20, "sqlite": 4}
# How often the slower chores run, in seconds.
DISCOVER_SECONDS = 5.0  # running jobs from the database; retire finished, drained jobs
CLAIM_SECONDS = 30.0  # XAUTOCLAIM entries left pending by a dead flusher
TRIM_SECONDS = 30.0
CLAIM_IDLE_MS = 60_000  # pending this long, the consumer that read it is presumed dead
# Written entries stay in the stream this long, so a live chart that reconnects resumes
# from its Last-Event-ID without a gap; older history comes from the database.
STREAM_RETENTION_MS = 15 * 60 * 1000
# Entries the rule watcher has not evaluated are kept this long at most (see Flusher._trim).
RULES_LAG_LIMIT_MS = 60 * 60 * 1000
RULES_GROUP = "rules"  # jobs.rules.watcher's consumer group (named here: jobs.rules imports this module's package)
FINISHED_STREAM_TTL_SECONDS = 24 * 3600
DRAIN_SECONDS = 10.0
# The longest one read waits before the set of active jobs is looked at again: a job that
# just started (its first points are what a person watches for, and what a warm start is
# timed by) waits no longer than this to be noticed, whatever `block_ms` allows.
NEW_JOB_WAIT_MS = 100
# Each flusher's figures for /metrics (trainyard_site.prometheus): one hash field per
# consumer name, a JSON object {"written", "dropped", "cycle_at", "lag"} rewritten at most
# once a second (STATS_SECONDS). A field whose cycle_at is older than STATS_STALE_SECONDS
# belongs to a flusher that stopped: readers ignore it, and a live flusher deletes fields
# older than STATS_FORGET_SECONDS so restarts (new pids) do not grow the hash for ever.
FLUSHER_STATS = "trainyard:flusher:stats"
STATS_SECONDS = 1.0
STATS_STALE_SECONDS = 60.0
STATS_FORGET_SECONDS = 3600.0


def job_keys(job_id: int) -> tuple[str, str]:
    return key(METRICS_STREAM, job_id), key(SYSTEM_STREAM, job_id)


def _id_tuple(stream_id: bytes | str | None) -> tuple[int, int]:
    ms, _, seq = text(stream_id or "0-0").partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Batch:
    """What one read produced; acks wait for the commit."""

    entries: list[MetricEntry] = field(default_factory=list)
    samples: list[SystemMetric] = field(default_factory=list)
    acks: dict[str, list[bytes]] = field(default_factory=dict)
    malformed: int = 0  # entries or samples dropped while parsing

    def entry_count(self) -> int:
        return sum(len(ids) for ids in self.acks.values())

    def job_ids(self) -> set[int]:
        return {e.job_id for e in self.entries} | {s.job_id for s in self.samples}


class Flusher:
    """One consumer of the flusher group. `flush_once` is one read-write-ack cycle."""

    def __init__(self, client: redis.Redis | None = None, *, consumer: str | None = None,
                 claim_idle_ms: int = CLAIM_IDLE_MS, discover_running: bool = True) -> None:
        self.redis = client or metrics_redis()
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.claim_idle_ms = claim_idle_ms
        self.discover_running = discover_running
        self._grouped: set[int] = set()
        self._running: set[int] = set()
        # Start by re-reading this consumer's own pending entries (id "0"), then new ones.
        self._recovering = True
        self._last_discover = 0.0
        self._last_claim = 0.0
        self._last_trim = time.monotonic()
        self.written = 0
        self.dropped = 0
        self.last_entries = 0  # stream entries the latest cycle read (0: all caught up)
        self._busy_streams = 1
        # Seconds between now and the oldest entry the latest read returned (the ms in its
        # stream id): how far behind the writers are; 0 once a read comes back empty.
        self.lag_seconds = 0.0
        self._last_stats = 0.0
        self._last_forget = 0.0
        self._count_lock = threading.Lock()  # writer threads update the counts

    # --- one cycle -------------------------------------------------------------------
    def flush_once(self, block_ms: int = 500) -> int:
        """1. Find active jobs (the SDK's set, plus running jobs from the database).
        2. Claim entries a dead consumer left pending (on start, then every 30 s).
        3. Read a batch (own pending first).
        4. Write it in one transaction; XACK after the commit.
        5. Chores: retire finished and drained jobs, trim written entries.
        Returns the number of points and samples handled: written, or dropped as
        malformed or belonging to a deleted job (0: nothing was waiting)."""
        batch, jobs = self.read_batch(block_ms)
        handled = batch.malformed
        if batch.acks:
            handled += self.write_batch(batch)
        self.chores(jobs)
        return handled

    def read_batch(self, block_ms: int) -> tuple[Batch, list[int]]:
        now = time.monotonic()
        jobs = self._active_jobs(now)
        if not jobs:
            if block_ms > 0:
                time.sleep(min(block_ms, NEW_JOB_WAIT_MS) / 1000)
            self.last_entries = 0
            self.lag_seconds = 0.0
            return Batch(), jobs
        self._ensure_groups(jobs)
        if now - self._last_claim >= CLAIM_SECONDS:
            self._last_claim = now
            self.claim_stale(jobs)
        batch = self._parse(self._read(jobs, min(block_ms, NEW_JOB_WAIT_MS)))
        self.last_entries = batch.entry_count()
        # Per stream the ids come in order: the first of each is its oldest. Per entry, not
        # per point, so the ingest path pays nothing per point for it.
        oldest_ms = min((_id_tuple(ids[0])[0] for ids in batch.acks.values() if ids), default=None)
        self.lag_seconds = 0.0 if oldest_ms is None else max(0.0, time.time() - oldest_ms / 1000)
        return batch, jobs

    def write_batch(self, batch: Batch, inserted: threading.Event | None = None) -> int:
        """Write and commit, then XACK. `inserted` is set once the batch's statements ran
        (before the commit): the pipelined loop starts the next batch then."""
        handled = self._write_with_retry(batch, inserted)
        self._ack(batch)
        return handled

    def chores(self, jobs: list[int]) -> None:
        now = time.monotonic()
        if now - self._last_stats >= STATS_SECONDS:
            self._last_stats = now
            self.publish_stats()
        if jobs and now - self._last_discover >= DISCOVER_SECONDS:
            self.retire_finished(jobs)
            self._last_discover = now
        if jobs and now - self._last_trim >= TRIM_SECONDS:
            self._last_trim = now
            self._trim(jobs)

    def publish_stats(self) -> None:
        """This consumer's figures into FLUSHER_STATS (see there). A Redis error is logged
        and skipped: figures for a dashboard must never stop the ingest."""
        now = time.time()
        stats = {"written": self.written, "dropped": self.dropped, "cycle_at": round(now, 3),
                 "lag": round(self.lag_seconds, 3)}
        try:
            self.redis.hset(FLUSHER_STATS, self.consumer, json.dumps(stats))
            if now - self._last_forget >= STATS_STALE_SECONDS:
                self._last_forget = now
                gone = [name for name, row in read_flusher_stats_rows(self.redis).items()
                        if now - row["cycle_at"] > STATS_FORGET_SECONDS]
                if gone:
                    self.redis.hdel(FLUSHER_STATS, *gone)
        except redis.RedisError:
            log.warning("flusher: could not publish its stats", exc_info=True)

    # --- which streams ---------------------------------------------------------------
    def _active_jobs(self, now: float) -> list[int]:
        ids: set[int] = set()
        for raw in self.redis.smembers(ACTIVE_METRIC_JOBS):
            try:
                ids.add(int(raw))
            except ValueError:
                self.redis.srem(ACTIVE_METRIC_JOBS, raw)  # garbage: nobody will ever flush it
        if self.discover_running and now - self._last_discover >= DISCOVER_SECONDS:
            # Jobs that write system samples or parsed stdout metrics may not have used the
            # SDK: read their streams too while they run.
            self._running = set(TrainingJob.objects.running().values_list("pk", flat=True))
        return sorted(ids | self._running)

    def _ensure_groups(self, jobs: list[int]) -> None:
        for job_id in jobs:
            if job_id in self._grouped:
                continue
            pipe = self.redis.pipeline(transaction=False)
            for stream in job_keys(job_id):
                # From id 0: points sent before any flusher saw the job are read too.
                pipe.xgroup_create(stream, FLUSHER_GROUP, id="0", mkstream=True)
            # A retired job's keys carry a TTL; a job that became active again keeps them.
            for stream in (*job_keys(job_id), key(LOGS_STREAM, job_id), key(EVENTS_STREAM, job_id)):
                pipe.persist(stream)
            for result in pipe.execute(raise_on_error=False):
                if isinstance(result, Exception) and "BUSYGROUP" not in str(result):
                    raise result
            self._grouped.add(job_id)

    # --- reading ---------------------------------------------------------------------
    def _read(self, jobs: list[int], block_ms: int) -> list[tuple[Any, list[Any]]]:
        streams = [s for job_id in jobs for s in job_keys(job_id)]
        # COUNT applies per stream: share the batch budget among the streams that had
        # entries last time, so one busy job gets full batches beside many idle ones.
        count = max(2, ENTRY_BUDGET.get(connection.vendor, 4) // max(1, self._busy_streams))
        for attempt in range(2):
            try:
                reply = self._read_streams(streams, count, block_ms)
                self._busy_streams = sum(1 for _, entries in reply if entries) or 1
                return reply
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc) or attempt:
                    raise
                # A stream expired or was deleted under us: recreate the groups, read again.
                self._grouped.clear()
                self._ensure_groups(jobs)
        return []

    def _read_streams(self, streams: list[str], count: int, block_ms: int) -> list[tuple[Any, list[Any]]]:
        if self._recovering:
            pending = stream_items(self.redis.xreadgroup(FLUSHER_GROUP, self.consumer, dict.fromkeys(streams, "0"),
                                                         count=count))
            if any(entries for _, entries in pending):
                return pending
            self._recovering = False
        return stream_items(self.redis.xreadgroup(FLUSHER_GROUP, self.consumer, dict.fromkeys(streams, ">"), count=count,
                                                  block=block_ms if block_ms > 0 else None))

    def _parse(self, response: list[tuple[Any, list[Any]]]) -> Batch:
        batch = Batch()
        for raw_stream, entries in response:
            if not entries:
                continue
            stream = text(raw_stream)
            job_id = int(stream.split(":")[2])
            is_metrics = stream.endswith(":metrics")
            ids = batch.acks.setdefault(stream, [])
            for entry_id, fields in entries:
                ids.append(entry_id)
                if fields is None:  # deleted while pending (XAUTOCLAIM reports it so)
                    continue
                try:
                    if is_metrics:
                        self._parse_points(batch, job_id, fields)
                    else:
                        self._parse_sample(batch, job_id, fields)
                except (ValueError, TypeError, KeyError) as exc:
                    # A poison entry is acked and logged; it must not block the stream.
                    batch.malformed += 1
                    log.warning("job %s: malformed entry %s on %s dropped (%s)", job_id, text(entry_id), stream, exc)
        if batch.malformed:
            log.warning("dropped %d malformed points/entries in this batch", batch.malformed)
        return batch

    @staticmethod
    def _parse_points(batch: Batch, job_id: int, fields: dict[bytes, bytes]) -> None:
        # The payload stays JSON: on PostgreSQL the server parses it (see write_points).
        batch.entries.append(MetricEntry(job_id=job_id, rank=int(fields[b"r"]), payload=fields[b"p"]))

    @staticmethod
    def _parse_sample(batch: Batch, job_id: int, fields: dict[bytes, bytes]) -> None:
        cpu, memory, unix_time = parse_number(fields.get(b"cpu")), parse_number(fields.get(b"mem")), parse_number(fields.get(b"t"))
        if cpu is None or memory is None or unix_time is None:
            raise ValueError("a system sample needs cpu, mem and t")
        gpu, gpu_memory = parse_number(fields.get(b"gpu")), parse_number(fields.get(b"gpu_mem"))
        batch.samples.append(SystemMetric(
            job_id=job_id, node_name=text(fields.get(b"n", b""))[:200], time=datetime.fromtimestamp(unix_time, tz=UTC),
            cpu_percent=cpu, memory_bytes=int(memory), gpu_percent=gpu,
            gpu_memory_bytes=int(gpu_memory) if gpu_memory is not None else None))

    # --- writing ---------------------------------------------------------------------
    def _write_with_retry(self, batch: Batch, inserted: threading.Event | None = None) -> int:
        try:
            return self._write(batch, inserted)
        except IntegrityError:
            # A job deleted between our existence check and the commit: SystemMetric keeps
            # its foreign key, which PostgreSQL checks at commit. Look again, once.
            log.info("a job vanished during the write; retrying the batch without it")
            return self._write(batch, inserted)

    def _write(self, batch: Batch, inserted: threading.Event | None = None) -> int:
        """One transaction; returns the points and samples handled."""
        handled = 0
        with transaction.atomic():
            if connection.vendor == "postgresql":
                # Our statements are simple and repeated; PostgreSQL's JIT would compile
                # them anew each batch (tens of ms) because their row estimates are large.
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL jit = off")
            wanted = batch.job_ids()
            known = lock_existing_jobs(wanted)
            entries, samples = batch.entries, batch.samples
            if missing := wanted - known:
                entries = [e for e in entries if e.job_id in known]
                samples = [s for s in samples if s.job_id in known]
                lost = sum(len(parse_entries([e])[0]) for e in batch.entries if e.job_id in missing)
                lost += len(batch.samples) - len(samples)
                handled += lost
                with self._count_lock:
                    self.dropped += lost
                log.warning("dropped %d points/samples of jobs that no longer exist: %s", lost, sorted(missing))
            written = 0
            if entries:
                written, malformed = write_points(entries)
                handled += malformed
            if samples:
                insert_samples(samples)
                written += len(samples)
            if inserted is not None:
                inserted.set()
        with self._count_lock:
            self.written += written
        return handled + written

    def _ack(self, batch: Batch) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in batch.acks.items():
            pipe.xack(stream, FLUSHER_GROUP, *ids)
        pipe.execute()

    # --- chores ----------------------------------------------------------------------
    def claim_stale(self, jobs: list[int]) -> int:
        """Take over entries another consumer read and never acked (it crashed)."""
        claimed = 0
        for job_id in jobs:
            for stream in job_keys(job_id):
                start = "0-0"
                while True:
                    try:
                        # Not JUSTID: redis-py then drops the cursor from the reply.
                        reply = self.redis.xautoclaim(stream, FLUSHER_GROUP, self.consumer, self.claim_idle_ms, start,
                                                      count=20)
                    except redis.ResponseError as exc:
                        if "NOGROUP" in str(exc):
                            self._grouped.discard(job_id)
                            break
                        raise
                    start, ids = reply[0], reply[1]
                    claimed += len(ids)
                    if text(start) == "0-0":
                        break
        if claimed:
            log.info("claimed %d entries left pending by a stopped flusher", claimed)
            self._recovering = True
        return claimed

    def _drained(self, stream: str) -> bool:
        try:
            groups = self.redis.xinfo_groups(stream)
            last = self.redis.xrevrange(stream, count=1)
        except redis.ResponseError:
            return True  # no stream: nothing to drain
        group = next((g for g in groups if text(g["name"]) == FLUSHER_GROUP), None)
        if group is None:
            return not last
        if group["pending"]:
            return False
        return not last or _id_tuple(last[0][0]) <= _id_tuple(group["last-delivered-id"])

    def retire_finished(self, jobs: list[int]) -> None:
        """Stop watching jobs that are finished (or deleted) once their streams are drained.
        WATCH makes the removal fail if a straggler wrote meanwhile; the next cycle retries."""
        states = dict(TrainingJob.objects.filter(pk__in=jobs).values_list("pk", "status"))
        for job_id in jobs:
            if job_id in states and states[job_id] not in FINISHED_STATUSES:
                continue
            streams = job_keys(job_id)
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(*streams)
                    if not all(self._drained(s) for s in streams):
                        pipe.unwatch()
                        continue
                    pipe.multi()
                    pipe.srem(ACTIVE_METRIC_JOBS, job_id)
                    for stream in (*streams, key(LOGS_STREAM, job_id), key(EVENTS_STREAM, job_id)):
                        pipe.expire(stream, FINISHED_STREAM_TTL_SECONDS)
                    pipe.execute()
                except redis.WatchError:
                    continue
            if job_id not in states and (orphans := delete_orphans(job_id)):
                # Points written by a batch that committed after the job's delete had
                # removed its points (no foreign key stops that any more).
                log.info("job %s: deleted %d points left after the job was deleted", job_id, orphans)
            self._grouped.discard(job_id)
            self._running.discard(job_id)
            log.info("job %s: metrics drained; no longer watched", job_id)

    def _trim(self, jobs: list[int]) -> None:
        """Delete written entries older than the resume window, never an unwritten one, nor
        one the rule watcher (its own group, jobs.rules.watcher) has not evaluated yet — unless
        that is older than RULES_LAG_LIMIT_MS: a watcher that is gone must not keep a stream
        growing for ever."""
        now_ms = int(time.time() * 1000)
        cutoff = (now_ms - STREAM_RETENTION_MS, 0)
        floor = (now_ms - RULES_LAG_LIMIT_MS, 0)
        for job_id in jobs:
            for stream in job_keys(job_id):
                try:
                    groups = {text(g["name"]): g for g in self.redis.xinfo_groups(stream)}
                    group = groups.get(FLUSHER_GROUP)
                    if group is None:
                        continue
                    bound = min(cutoff, _id_tuple(group["last-delivered-id"]))
                    pending = self.redis.xpending(stream, FLUSHER_GROUP)
                    if pending["pending"]:
                        bound = min(bound, _id_tuple(pending["min"]))
                    if (rules := groups.get(RULES_GROUP)) is not None:
                        waiting = _id_tuple(rules["last-delivered-id"])
                        rules_pending = self.redis.xpending(stream, RULES_GROUP)
                        if rules_pending["pending"]:
                            waiting = min(waiting, _id_tuple(rules_pending["min"]))
                        bound = min(bound, max(waiting, floor))
                    if bound > (0, 0):
                        self.redis.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=True)
                except redis.ResponseError:
                    continue


# --- the flushers' figures (read by /metrics) --------------------------------------------
@dataclass(frozen=True)
class FlusherStats:
    """The live flushers' figures summed: points and samples written and dropped since each
    started (a restart starts its count again), the latest cycle, the worst lag."""

    flushers: int
    written: int
    dropped: int
    last_cycle_at: float | None  # unix time, of any flusher (stale ones too)
    lag_seconds: float


def read_flusher_stats_rows(client: redis.Redis) -> dict[str, dict[str, float]]:
    """Every consumer's row of FLUSHER_STATS, stale or not; unreadable rows are left out."""
    rows: dict[str, dict[str, float]] = {}
    for name, raw in client.hgetall(FLUSHER_STATS).items():
        try:
            row = json.loads(raw)
            rows[text(name)] = {field: float(row[field]) for field in ("written", "dropped", "cycle_at", "lag")}
        except (ValueError, TypeError, KeyError):
            continue
    return rows


def read_flusher_stats(client: redis.Redis, now: float | None = None) -> FlusherStats:
    """The flushers that cycled in the last STATS_STALE_SECONDS, summed (one HGETALL). The
    latest cycle is over every row, stale ones included: when every flusher has stopped (or
    fails each cycle), that time is what says since when."""
    now = time.time() if now is None else now
    rows = list(read_flusher_stats_rows(client).values())
    live = [row for row in rows if now - row["cycle_at"] <= STATS_STALE_SECONDS]
    return FlusherStats(
        flushers=len(live), written=int(sum(row["written"] for row in live)),
        dropped=int(sum(row["dropped"] for row in live)),
        last_cycle_at=max((row["cycle_at"] for row in rows), default=None),
        lag_seconds=max((row["lag"] for row in live), default=0.0))


# --- the long-running loop -------------------------------------------------------------
_default_flusher: Flusher | None = None


def flush_once(block_ms: int = 0) -> int:
    """One cycle of this process's flusher (see Flusher.flush_once)."""
    global _default_flusher
    if _default_flusher is None:
        _default_flusher = Flusher()
    return _default_flusher.flush_once(block_ms=block_ms)


def install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM and SIGINT set `stop`; the loop then drains and returns. Returns the
    previous handlers (to restore them)."""

    def handler(signum: int, frame: Any) -> None:
        log.info("flusher: %s received; draining, then stopping", signal.Signals(signum).name)
        stop.set()

    return {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}


class _Writer(threading.Thread):
    """Writes batches on its own database connection, one at a time."""

    def __init__(self, flusher: Flusher, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.flusher = flusher
        self.batches: queue.Queue[Batch | None] = queue.Queue(maxsize=1)
        self.idle = threading.Event()  # its last batch is committed and acked (or failed)
        self.inserted = threading.Event()  # its last batch's statements ran
        self.idle.set()
        self.inserted.set()
        self.failed = False

    def submit(self, batch: Batch) -> None:
        self.idle.clear()
        self.inserted.clear()
        self.batches.put(batch)

    def run(self) -> None:
        try:
            while (batch := self.batches.get()) is not None:
                _refresh_connection()
                try:
                    self.flusher.write_batch(batch, self.inserted)
                except Exception:  # noqa: BLE001 - the entries stay pending and are re-read
                    log.exception("flusher write failed; its entries will be read again")
                    self.failed = True
                    self.flusher._recovering = True
                finally:
                    self.inserted.set()
                    self.idle.set()
        finally:
            connection.close()


class WriterPool:
    """Overlaps the commit of one batch, and the reading of the next from Redis, with the
    statements of another.

    With two connections, batch N+1 starts as soon as batch N's statements ran (N's
    commit waits for its WAL flush meanwhile). Order still holds: N+1 starts after N's
    statements, so a point both contain waits for N's commit and N+1's value wins, a
    chunk both touch waits for N's commit (row lock) before N+1 merges or recomputes
    it, and N+1 reads final_metrics after N committed (it waits for the job row's lock)."""

    def __init__(self, flusher: Flusher, writers: int) -> None:
        self.writers = [_Writer(flusher, f"flusher-writer-{i}") for i in range(writers)]
        for writer in self.writers:
            writer.start()
        self._next = 0
        self._last: _Writer | None = None

    def submit(self, batch: Batch) -> None:
        writer = self.writers[self._next % len(self.writers)]
        self._next += 1
        writer.idle.wait()
        if self._last is not None:
            self._last.inserted.wait()
        writer.submit(batch)
        self._last = writer

    def take_failure(self) -> bool:
        failed = any(w.failed for w in self.writers)
        for writer in self.writers:
            writer.failed = False
        return failed

    def wait_idle(self) -> None:
        for writer in self.writers:
            writer.idle.wait()

    def close(self) -> None:
        for writer in self.writers:
            writer.batches.put(None)
        for writer in self.writers:
            writer.join(30)


def run_flusher(stop: threading.Event, *, block_ms: int = 500, drain_seconds: float = DRAIN_SECONDS,
                flusher: Flusher | None = None, writers: int | None = None) -> Flusher:
    """Flush until `stop` is set, then drain what is waiting (bounded) and return.

    `writers`: database connections writing in turn (default 2 on PostgreSQL, see
    WriterPool; 1 elsewhere: SQLite has one writer anyway). With 1, batches are written
    on this thread. A failing cycle (database or Redis down) is logged and retried with
    backoff; its entries stay pending and are re-read, so nothing is lost."""
    flusher = flusher or Flusher()
    count = writers or (2 if connection.vendor == "postgresql" else 1)
    pool = WriterPool(flusher, count) if count > 1 else None

    def cycle(block: int) -> None:
        if pool is None:
            flusher.flush_once(block_ms=block)
            return
        batch, jobs = flusher.read_batch(block)
        if batch.acks:
            pool.submit(batch)
        flusher.chores(jobs)
        if pool.take_failure():
            raise RuntimeError("a batch could not be written (logged above)")

    backoff = 0.0
    try:
        while not stop.is_set():
            _refresh_connection()
            try:
                cycle(block_ms)
                backoff = 0.0
            except Exception:  # noqa: BLE001 - the loop outlives any one bad cycle
                backoff = min(10.0, max(0.5, backoff * 2))
                log.exception("flusher cycle failed; retrying in %.1f s", backoff)
                if pool is not None:
                    pool.wait_idle()
                flusher._recovering = True
                stop.wait(backoff)
        deadline = time.monotonic() + drain_seconds
        while time.monotonic() < deadline:
            try:
                cycle(0)
                if flusher.last_entries == 0:
                    break
            except Exception:  # noqa: BLE001
                log.exception("flusher drain failed; stopping (pending entries are re-read by the next flusher)")
                break
    finally:
        if pool is not None:
            pool.wait_idle()
            pool.close()
        flusher.publish_stats()  # the drained batches' counts, before the field goes stale
    _refresh_connection()
    return flusher


def _refresh_connection() -> None:
    # Like a request boundary: drop a broken or expired connection. Not inside a
    # transaction (a test's), where Django would close the connection under it.
    if not connection.in_atomic_block:
        close_old_connections()
