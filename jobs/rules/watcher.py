"""The rule watcher: evaluates every running job's rules on its streams as points arrive.

    python manage.py studio flusher     # runs a RuleWatcher on a thread beside the flusher

It reads the jobs' metric streams through its own consumer group (RULES_GROUP, beside the
flusher's), so it sees every point the flusher writes without asking the database, and an
entry is acked only after its transitions are stored: a watcher that dies leaves it
pending, and the next one reads it again. Log lines and system samples are read with plain
XREADs (they only tell activity and GPU use; a missed one costs nothing). The clock-driven
rules (stalled, max_init_time, budget, missing data) are ticked every
STUDIO_RULES_TICK_SECONDS. The database is read for rule definitions and running jobs
every DISCOVER_SECONDS, never for points.

One watcher at a time evaluates (a rule's window must see all of its job's points): the
watchers of several flushers elect a leader with a Redis lock it renews; a new leader
claims what the old one left pending.

Fast path: a payload that may hold a NaN/Infinity is parsed with json.loads and every rule
sees every point. Any other is decoded by msgspec into typed rows the garbage collector does
not track (Row); the curve rules get their metrics' points (as columns when they watch one
metric), the other rules the first point of each metric while they wait for their first
datum, and activity after that."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

import msgspec
import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.db.models import Min

from jobs.metrics import metrics_redis, parse_number, stream_items, text

# The watcher's consumer group; the flusher's trim keeps what it has not evaluated.
from jobs.metrics.ingest import RULES_GROUP
from jobs.models import JobRule, JobStatus, MetricPoint, TrainingJob
from jobs.rules.engine import INSUFFICIENT_DATA, Evaluator, GpuSample, Point, PointColumns, Transition, evaluator
from jobs.rules.store import RULES_CHANGED_KEY, record, record_many
from trainyard.protocol import LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

log = logging.getLogger(__name__)

LEADER_KEY = "trainyard:rules:leader"
LEADER_TTL_MS = 10_000
DISCOVER_SECONDS = 2.0
CLAIM_IDLE_MS = 0  # a new leader takes over everything the group left pending
# A rule taken up while its job runs refills its windows from this many of the newest entries
# the group already acked (the flusher keeps them STREAM_RETENTION_MS, 15 min).
WARM_ENTRIES = 1000
# The rule types that read a curve, and the parameters naming its metric(s): once no rule
# waits for data, only these metrics' points are made of a payload without NaN/Infinity.
CURVE_METRIC_PARAMS: dict[str, tuple[str, ...]] = {
    "custom": ("metric",), "loss_not_decreasing": ("metric",), "overtraining": ("metric",),
    "step_outlier": ("metric",), "overfit": ("train_metric", "validation_metric")}
# Entries parsed whole while a rule waits for its first datum (then only its metrics are).
FULL_PARSE_ENTRIES = 20
# The statuses in which the clock-driven rules are ticked: the job's processes run.
TICKING_STATUSES = frozenset({JobStatus.STARTING, JobStatus.TRAINING})
COST_SECONDS = 1.0  # how often a budget rule's cost is recomputed: each tick (5 s let a short job pass its limit unseen)


def _rank(raw: bytes | str) -> int | None:
    try:
        return int(raw)
    except (ValueError, TypeError):
        return None


def entry_time(entry_id: bytes | str) -> float:
    return int(text(entry_id).partition("-")[0]) / 1000.0


def _unix(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


@dataclass
class WatchedRule:
    rule: JobRule
    evaluator: Evaluator
    updated_at: datetime


@dataclass
class WatchedJob:
    job_id: int
    attempt: int
    started_at: float
    rules: dict[int, WatchedRule] = field(default_factory=dict)
    first_step_at: float | None = None
    # The newest metric entry or log line seen (their stream ids' times): where a rule taken
    # up while the job runs starts its clock (Evaluator.resume).
    last_activity_at: float | None = None
    log_id: str = "0-0"
    system_id: str = "0-0"
    wants_gpu: bool = False
    wants_cost: bool = False
    last_cost_at: float = 0.0
    cost: float | None = None
    projected_cost: float | None = None

    names: frozenset[str] = frozenset()  # the metrics the curve rules read
    curve: list[WatchedRule] = field(default_factory=list)  # rules of CURVE_METRIC_PARAMS' types
    full_parses_left: int = FULL_PARSE_ENTRIES
    span: tuple[bytes, bytes] | None = None  # (a row's start, the quoted name) of the one watched metric

    def refresh_kinds(self) -> None:
        types = {w.rule.type for w in self.rules.values()}
        self.wants_gpu = "low_gpu_utilization" in types
        self.wants_cost = "budget" in types
        self.curve = [w for w in self.rules.values() if w.rule.type in CURVE_METRIC_PARAMS]
        self.names = frozenset(str(w.rule.parameters.get(p)) for w in self.curve for p in CURVE_METRIC_PARAMS[w.rule.type]
                               if w.rule.parameters.get(p))
        # The one watched metric as JSON writes a row's start ('["loss",') and its name ('"loss"').
        only = next(iter(self.names)) if len(self.names) == 1 else None
        self.span = (b"[" + json.dumps(only).encode() + b",", json.dumps(only).encode()) if only is not None else None

    def saw_activity(self, at: float) -> None:
        if self.last_activity_at is None or at > self.last_activity_at:
            self.last_activity_at = at

    def waiting(self) -> bool:
        """A rule still waits for its first datum: it must see every point (its first one,
        or the names it will list if it never gets one), for a while."""
        return self.full_parses_left > 0 and any(w.evaluator.state == INSUFFICIENT_DATA for w in self.rules.values())


class RuleWatcher:
    def __init__(self, client: redis.Redis | None = None, *, consumer: str | None = None,
                 discover_seconds: float = DISCOVER_SECONDS, tick_seconds: float | None = None) -> None:
        self.redis = client or metrics_redis()
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-rules"
        self.discover_seconds = discover_seconds
        self.tick_seconds = tick_seconds if tick_seconds is not None else settings.STUDIO_RULES_TICK_SECONDS
        self.jobs: dict[int, WatchedJob] = {}
        self._grouped: set[int] = set()
        self._last_discover = 0.0
        self._last_tick = 0.0
        self._rules_seen: Any = None  # the counter as Redis gave it
        self._leader = False
        self._recovering = True
        self.points_seen = 0  # points handed to rules
        self.entries_seen = 0
        self.transitions = 0
        self.cpu_seconds = 0.0  # this thread's CPU time reading, evaluating and storing
        # What this cycle caused, stored in one transaction at its end (_commit), and then the
        # entries it read acked: a watcher that dies before leaves them pending.
        self._records: list[tuple[WatchedRule, list[Transition]]] = []
        self._acks: dict[str, list[Any]] = {}

    # --- leadership ------------------------------------------------------------------
    def lead(self) -> bool:
        """Take or keep the leader lock; False while another watcher holds it."""
        try:
            if self._leader:
                script = ("if redis.call('get', KEYS[1]) == ARGV[1] then "
                          "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end")
                self._leader = bool(self.redis.eval(script, 1, LEADER_KEY, self.consumer, LEADER_TTL_MS))
            if not self._leader:
                self._leader = bool(self.redis.set(LEADER_KEY, self.consumer, nx=True, px=LEADER_TTL_MS))
                if self._leader:
                    log.info("rule watcher %s: leading", self.consumer)
                    self._grouped.clear()
                    self.jobs.clear()
                    self._recovering = True
                    self._last_discover = 0.0
        except redis.RedisError:
            self._leader = False
        return self._leader

    def resign(self) -> None:
        script = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
        with contextlib.suppress(redis.RedisError):
            self.redis.eval(script, 1, LEADER_KEY, self.consumer)
        self._leader = False

    # --- one cycle -------------------------------------------------------------------
    def cycle(self, block_ms: int = 100) -> int:
        """Discover (every DISCOVER_SECONDS), read and evaluate what arrived, tick the
        clock-driven rules. Returns the number of transitions recorded."""
        if not self.lead():
            time.sleep(min(block_ms, 1000) / 1000)
            return 0
        before = self.transitions
        try:
            now = time.monotonic()
            if now - self._last_discover >= self.discover_seconds or self._rules_changed():
                self._last_discover = now
                self.discover()
            if not self.jobs:
                time.sleep(block_ms / 1000)
                return 0
            cpu = time.thread_time()
            self.read(list(self.jobs), block_ms)
            self.cpu_seconds += time.thread_time() - cpu
            if now - self._last_tick >= self.tick_seconds:
                self._last_tick = now
                self.tick(time.time())
        finally:
            cpu = time.thread_time()
            self._commit()
            self.cpu_seconds += time.thread_time() - cpu
        return self.transitions - before

    # --- which jobs and rules --------------------------------------------------------
    def _rules_changed(self) -> bool:
        """Whether a rule was added, changed or deleted since the last look (the API bumps
        RULES_CHANGED_KEY): a rule turned off stops being evaluated within a cycle, not at
        the next discovery."""
        try:
            seen = self.redis.get(RULES_CHANGED_KEY)
        except redis.RedisError:
            return False
        changed, self._rules_seen = seen != self._rules_seen, seen
        return changed

    def discover(self) -> None:
        running = {row["pk"]: row for row in TrainingJob.objects.running().values("pk", "attempt", "started_at")}
        for job_id in [j for j in self.jobs if j not in running]:
            self.finish(job_id)
        if not running:
            return
        # Only the rules that are new or changed since the last look are loaded whole.
        known = {rule_id: w.rule for watched in self.jobs.values() for rule_id, w in watched.rules.items()}
        listed = list(JobRule.objects.filter(job_id__in=list(running), enabled=True).order_by("pk")
                      .values_list("pk", "updated_at"))
        fresh = [pk for pk, updated_at in listed if pk not in known or known[pk].updated_at != updated_at]
        loaded = {rule.pk: rule for rule in JobRule.objects.filter(pk__in=fresh)} if fresh else {}
        rules: dict[int, list[JobRule]] = {}
        for pk, _ in listed:
            rule = loaded.get(pk) or known.get(pk)
            if rule is not None:
                rules.setdefault(rule.job_id, []).append(rule)
        for job_id, row in running.items():
            watched = self.jobs.get(job_id)
            started = _unix(row["started_at"]) or time.time()
            if watched is not None and watched.attempt != row["attempt"]:
                # A new attempt (a lost node's retry): its clock starts again; states carry over.
                watched.attempt, watched.started_at, watched.first_step_at = row["attempt"], started, None
                for w in watched.rules.values():
                    w.evaluator = self._evaluator(w.rule, started, carry=w.evaluator)
            if watched is None:
                if not rules.get(job_id):
                    continue
                watched = self.jobs[job_id] = WatchedJob(job_id=job_id, attempt=row["attempt"], started_at=started)
                self._ensure_group(job_id)
                self._start_activity(watched)  # before the rules: their clocks resume at its newest activity
            self._sync_rules(watched, rules.get(job_id, []))
            if not watched.rules:
                self.jobs.pop(job_id, None)

    def _evaluator(self, rule: JobRule, started_at: float, *, carry: Evaluator | None = None,
                   resume_at: float | None = None) -> Evaluator:
        """The rule's evaluator; its state (and whether it ever had data) carried from the one it
        replaces, else from the stored rule (a state changed once means it had data once), its
        clock resumed at the job's newest activity (`resume_at`, else now: a restarted watcher
        must not read the time since the job's start as silence)."""
        spec = {"name": rule.name, "type": rule.type, "parameters": rule.parameters, "actions": rule.actions,
                "enabled": rule.enabled}
        if carry is not None:
            # The stored state, not the replaced evaluator's: a verdict it reached under the old
            # definition after the change was dropped (jobs.rules.store._still_current).
            return evaluator(spec, started_at=started_at, state=rule.state, had_data=carry.had_data)
        ev = evaluator(spec, started_at=started_at, state=rule.state,
                       had_data=rule.state != INSUFFICIENT_DATA or rule.state_changed_at is not None)
        ev.resume(resume_at if resume_at is not None else time.time())
        return ev

    def _sync_rules(self, watched: WatchedJob, rules: list[JobRule]) -> None:
        wanted = {rule.pk: rule for rule in rules}
        fresh: list[Evaluator] = []
        for rule_id in [r for r in watched.rules if r not in wanted]:
            del watched.rules[rule_id]
        for rule_id, rule in wanted.items():
            current = watched.rules.get(rule_id)
            if current is not None and current.updated_at == rule.updated_at:
                continue
            try:
                # A changed definition starts a fresh window; the state carries over.
                ev = self._evaluator(rule, watched.started_at, carry=current.evaluator if current else None,
                                     resume_at=watched.last_activity_at)
            except Exception:  # noqa: BLE001 - a rule stored before a check changed must not stop the others
                log.exception("job %s rule %s: cannot be evaluated", rule.job_id, rule.name)
                continue
            watched.rules[rule_id] = WatchedRule(rule=rule, evaluator=ev, updated_at=rule.updated_at)
            if current is None:
                fresh.append(ev)
        watched.refresh_kinds()
        if fresh:
            self._warm(watched.job_id, fresh)

    def _warm(self, job_id: int, evaluators: list[Evaluator]) -> None:
        """Rules this watcher takes up while the job runs (its own restart, a new leader, a
        rule added) see the newest entries the group already acked, which an earlier watcher
        (or this one) judged: an "M of N" rule 2 of 3 into its alarm stays so, and a curve
        rule's window is not empty. Those entries cause no transition (Evaluator.warm); what
        is pending is read and judged as usual."""
        stream = key(METRICS_STREAM, job_id)
        try:
            groups = {text(g["name"]): g for g in self.redis.xinfo_groups(stream)}
            group = groups.get(RULES_GROUP)
            if group is None or text(group["last-delivered-id"]) == "0-0":
                return
            bound = text(group["last-delivered-id"])
            pending = self.redis.xpending(stream, RULES_GROUP)
            if pending["pending"]:
                bound = "(" + text(pending["min"])  # before the oldest unacked one
            entries: Any = self.redis.xrevrange(stream, max=bound, min="-", count=WARM_ENTRIES)
        except redis.RedisError:
            return
        points: list[Point] = []
        for _, fields in reversed(entries or []):
            if fields:
                points.extend(parse_points(fields.get(b"p", b""), rank=fields.get(b"r", b"0")))
        for ev in evaluators:
            try:
                ev.warm(points)
            except Exception:  # noqa: BLE001 - a window left empty is what a restart gave before
                log.exception("job %s rule %s: could not refill its window", job_id, ev.spec.get("name"))

    def _ensure_group(self, job_id: int) -> None:
        if job_id in self._grouped:
            return
        try:
            # From id 0: a NaN logged before the watcher saw the job is still caught.
            self.redis.xgroup_create(key(METRICS_STREAM, job_id), RULES_GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._grouped.add(job_id)

    def _start_activity(self, watched: WatchedJob) -> None:
        """The latest log line and system sample so far: only newer ones are read. The newest
        of it and of the metric entries (read or not) is the job's last activity."""
        for stream, attr in ((LOGS_STREAM, "log_id"), (SYSTEM_STREAM, "system_id"), (METRICS_STREAM, None)):
            try:
                last = self.redis.xrevrange(key(stream, watched.job_id), count=1)
            except redis.RedisError:
                continue
            if last:
                last_id: Any = last[0][0]
                if attr is not None:
                    setattr(watched, attr, text(last_id))
                if stream != SYSTEM_STREAM:
                    watched.saw_activity(entry_time(last_id))
        watched.first_step_at = self._first_step_so_far(watched)

    def _first_step_so_far(self, watched: WatchedJob) -> float | None:
        """When the attempt's first metric point came, if it came before this watcher took
        the job up: the oldest entry of the stream (the flusher trims what it has stored) or
        of the stored points, from the attempt's start on. A max_init_time rule added after a
        restart judges that, not the next point (which would read as a first step hours late)."""
        first: float | None = None
        with contextlib.suppress(redis.RedisError):
            oldest: Any = self.redis.xrange(key(METRICS_STREAM, watched.job_id), count=1)
            at = entry_time(oldest[0][0]) if oldest else None
            if at is not None and at >= watched.started_at:
                first = at
        try:
            stored = (MetricPoint.objects.filter(job_id=watched.job_id,
                                                 time__gte=datetime.fromtimestamp(watched.started_at, tz=UTC))
                      .aggregate(first=Min("time"))["first"])
        except DatabaseError:
            close_old_connections()
            return first
        if stored is not None and (first is None or stored.timestamp() < first):
            first = stored.timestamp()
        return first

    # --- reading ---------------------------------------------------------------------
    def read(self, job_ids: list[int], block_ms: int) -> None:
        streams = {key(METRICS_STREAM, job_id): job_id for job_id in job_ids}
        start = "0" if self._recovering else ">"
        try:
            reply = stream_items(self.redis.xreadgroup(RULES_GROUP, self.consumer, dict.fromkeys(streams, start),
                                                       count=50, block=None if self._recovering else block_ms))
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._grouped.clear()
            for job_id in job_ids:
                self._ensure_group(job_id)
            return
        if self._recovering and not any(entries for _, entries in reply):
            self._recovering = False
            self._claim(job_ids)
        for raw_stream, entries in reply:
            if entries:
                self.observe_entries(streams[text(raw_stream)], entries)
        self._read_activity(job_ids)

    def _claim(self, job_ids: list[int]) -> None:
        """Entries another watcher read and never acked (it died, or lost the lead)."""
        for job_id in job_ids:
            stream = key(METRICS_STREAM, job_id)
            cursor = "0-0"
            while True:
                try:
                    reply = self.redis.xautoclaim(stream, RULES_GROUP, self.consumer, CLAIM_IDLE_MS, cursor, count=50)
                except redis.ResponseError:
                    break
                cursor, entries = reply[0], reply[1]
                if entries:
                    self.observe_entries(job_id, [e for e in entries if e and e[1] is not None])
                if text(cursor) == "0-0":
                    break

    def observe_entries(self, job_id: int, entries: list[Any]) -> None:
        """Hand the entries' points to the job's rules. An entry is parsed whole when it holds
        a NaN/Infinity (every rule sees it) or while a rule waits for its first datum;
        otherwise only the curve rules' metrics are picked out of it for the curve rules
        (non_finite has nothing to see in it), and it counts as activity for the rest."""
        watched = self.jobs.get(job_id)
        ids = [entry_id for entry_id, _ in entries]
        if watched is not None:
            every: list[Point] = []  # from entries parsed whole: for the other rules
            curve: list[Point] = []  # those plus the picked-out points, in stream order: for the curve rules
            # The fast path: the curve rules watch one metric and no entry of this read is parsed
            # whole — its points go to them as columns per rank (jobs.rules.engine.PointColumns).
            columns: dict[int, tuple[list[int], list[float], list[float]]] | None = {} if len(watched.names) == 1 else None
            waiting = watched.waiting()
            for entry_id, fields in entries:
                if fields is None:
                    continue
                self.entries_seen += 1
                at = entry_time(entry_id)
                watched.saw_activity(at)
                if watched.first_step_at is None:
                    watched.first_step_at = at
                payload = fields.get(b"p", b"")
                rank = fields.get(b"r", b"0")
                rank_number = _rank(rank)
                if may_be_non_finite(payload):
                    rows = None
                elif columns is not None and not waiting and rank_number is not None and watched.span is not None:
                    # The fastest path: only the rows of the one watched metric are decoded.
                    picked = span_rows(payload, *watched.span)
                    if picked is not None:
                        columns_of(picked, next(iter(watched.names)), rank_number, columns)
                        for w in watched.rules.values():
                            w.evaluator.observe_activity(at)
                        continue
                    rows = payload_rows(payload)
                else:
                    rows = payload_rows(payload)
                if rows is None or rank_number is None:
                    # A NaN/Infinity, or what only json.loads reads: every rule sees every point.
                    if columns:
                        curve.extend(_points_of(columns, watched.names))
                    columns = None
                    points = parse_points(payload, rank=rank)
                    every.extend(points)
                    curve.extend(points)
                else:
                    if waiting:
                        # A rule waits for its first datum: the first point of each metric tells
                        # it (and the names it lists if none comes).
                        firsts = first_points_of(rows, rank_number)
                        every.extend(firsts)
                        others = [p for p in firsts if p.name not in watched.names]
                        if columns is not None and not curve:
                            # The curve rules take this entry at once, as columns (below, `waiting`
                            # feeds the rest): the other metrics' first points, then their own.
                            self._feed_columns(watched, columns)
                            self._feed(watched, [], others)
                            columns_of(rows, next(iter(watched.names)), rank_number, columns)
                            self._feed_columns(watched, columns)
                            for w in watched.rules.values():
                                w.evaluator.observe_activity(at)
                            watched.full_parses_left -= 1
                            self._feed(watched, every, [])
                            every = []
                            waiting = watched.waiting()
                            continue
                        if columns:
                            curve.extend(_points_of(columns, watched.names))
                        columns = None
                        curve.extend(others)
                    if columns is not None:
                        columns_of(rows, next(iter(watched.names)), rank_number, columns)
                    elif watched.names:
                        curve.extend(points_of(rows, watched.names, rank_number))
                    for w in watched.rules.values():
                        w.evaluator.observe_activity(at)
                if waiting:
                    # Evaluate now: the next entry may need less.
                    watched.full_parses_left -= 1
                    self._feed(watched, every, curve)
                    every, curve = [], []
                    waiting = watched.waiting()
                    if not waiting and len(watched.names) == 1:
                        columns = {}  # all fed so far: the rest may take the fast path
            self._feed(watched, every, curve)
            if columns:
                self._feed_columns(watched, columns)
        self._acks.setdefault(key(METRICS_STREAM, job_id), []).extend(ids)

    def _feed(self, watched: WatchedJob, every: list[Point], curve: list[Point]) -> None:
        self.points_seen += len(curve)
        if every:
            for w in list(watched.rules.values()):
                if w.rule.type not in CURVE_METRIC_PARAMS:
                    self._record(w, w.evaluator.observe(every))
        if curve:
            for w in list(watched.curve):
                self._record(w, w.evaluator.observe(curve))

    def _feed_columns(self, watched: WatchedJob, columns: dict[int, tuple[list[int], list[float], list[float]]]) -> None:
        """The curve rules' one metric, gathered as columns per rank, to the curve rules; then
        empty (a fresh list per batch: a batch handed to rules is never changed)."""
        name = next(iter(watched.names))
        for rank_number, (steps, values, times) in columns.items():
            batch = PointColumns(name, rank_number, steps, values, times)
            self.points_seen += len(batch)
            for w in list(watched.curve):
                self._record(w, w.evaluator.observe(batch))
        columns.clear()

    def _read_activity(self, job_ids: list[int]) -> None:
        logs = {key(LOGS_STREAM, j): j for j in job_ids}
        systems = {key(SYSTEM_STREAM, j): j for j in job_ids if self.jobs[j].wants_gpu}
        wanted: dict[Any, Any] = {s: self.jobs[j].log_id for s, j in logs.items()}
        wanted.update({s: self.jobs[j].system_id for s, j in systems.items()})
        try:
            reply = stream_items(self.redis.xread(wanted, count=500))
        except redis.RedisError:
            return
        for raw_stream, entries in reply:
            if not entries:
                continue
            stream = text(raw_stream)
            if stream in logs:
                watched = self.jobs[logs[stream]]
                watched.log_id = text(entries[-1][0])
                at = entry_time(entries[-1][0])
                watched.saw_activity(at)
                for w in watched.rules.values():
                    w.evaluator.observe_activity(at)
            else:
                watched = self.jobs[systems[stream]]
                watched.system_id = text(entries[-1][0])
                samples = [s for _, fields in entries for s in gpu_samples(fields)]
                if samples:
                    for w in list(watched.rules.values()):
                        self._record(w, w.evaluator.observe_gpu(samples))

    # --- the clock -------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Tick the clock-driven rules of the jobs whose processes run (Starting, Training).
        Once a job uploads its output or is being stopped, silence is expected and its cost
        is nearly settled: a `stalled` or `budget` rule firing then (before the next
        discovery sees the job end) alarmed and notified about a job that had finished.
        Their points are still read and judged (a NaN logged last still counts)."""
        statuses = self._statuses()
        for watched in list(self.jobs.values()):
            if statuses.get(watched.job_id) not in TICKING_STATUSES:
                continue
            if watched.wants_cost and now - watched.last_cost_at >= COST_SECONDS:
                watched.last_cost_at = now
                watched.cost, watched.projected_cost = job_costs(watched.job_id)
            for w in list(watched.rules.values()):
                self._record(w, w.evaluator.tick(now, cost=watched.cost, projected_cost=watched.projected_cost,
                                                 first_step_at=watched.first_step_at))

    def _statuses(self) -> dict[int, str]:
        """{job id: status} of the watched jobs, read on each tick (one small query); empty
        when the database cannot say (no clock rule fires on a guess)."""
        try:
            return dict(TrainingJob.objects.filter(pk__in=list(self.jobs)).values_list("pk", "status"))
        except DatabaseError:
            log.warning("rule watcher: could not read the jobs' statuses; the clock rules wait", exc_info=True)
            return {}

    def finish(self, job_id: int) -> None:
        """The job ended: read what is left of its stream, tell each rule (one that never got
        data says so), and stop watching it."""
        watched = self.jobs.get(job_id)
        if watched is None:
            return
        try:
            reply = stream_items(self.redis.xreadgroup(RULES_GROUP, self.consumer, {key(METRICS_STREAM, job_id): ">"},
                                                       count=1000))
            for _, entries in reply:
                if entries:
                    self.observe_entries(job_id, entries)
        except redis.RedisError:
            pass
        if watched.wants_cost:
            watched.cost, watched.projected_cost = job_costs(job_id)
        now = time.time()
        for w in list(watched.rules.values()):
            self._record(w, w.evaluator.tick(now, cost=watched.cost, projected_cost=None,
                                             first_step_at=watched.first_step_at, finished=True))
        self._commit()
        self.jobs.pop(job_id, None)
        self._grouped.discard(job_id)
        with contextlib.suppress(redis.RedisError):
            self.redis.xgroup_destroy(key(METRICS_STREAM, job_id), RULES_GROUP)

    def _record(self, watched_rule: WatchedRule, transitions: list[Transition]) -> None:
        if transitions:
            self.transitions += len(transitions)
            self._records.append((watched_rule, transitions))

    def _commit(self) -> None:
        """Store what the cycle caused (jobs.rules.store.record_many: one transaction; a
        failure there stores each rule's on its own, so one bad row loses only its own),
        then ack the entries read. A database hiccup never ends the watcher: the states are
        kept in memory."""
        records, self._records = self._records, []
        if records:
            try:
                record_many([(w.rule, transitions) for w, transitions in records])
            except Exception:  # noqa: BLE001 - nothing of the batch committed: one rule at a time
                log.warning("could not store %d rules' transitions at once; one at a time", len(records), exc_info=True)
                for w, transitions in records:
                    try:
                        record(w.rule, transitions)
                    except Exception:  # noqa: BLE001 - see above
                        log.exception("job %s rule %s: could not store %d transition(s)", w.rule.job_id, w.rule.name,
                                      len(transitions))
        acks, self._acks = self._acks, {}
        if acks:
            try:
                pipe = self.redis.pipeline(transaction=False)
                for stream, ids in acks.items():
                    pipe.xack(stream, RULES_GROUP, *ids)
                pipe.execute()
            except redis.RedisError:
                log.warning("could not ack %d entries (they will be read again)", sum(map(len, acks.values())))


def parse_points(payload: bytes, *, rank: bytes | str) -> list[Point]:
    """The points of one stream entry (the SDK's JSON [[name, step, value, time], ...];
    NaN and ±Infinity bare or as strings). Malformed points are skipped (the flusher logs them)."""
    rank_number = _rank(rank)
    try:
        raw = json.loads(payload)
    except (ValueError, TypeError, RecursionError):  # RecursionError: brackets nested past json's depth
        return []
    if rank_number is None:
        return []
    points = []
    for item in raw if isinstance(raw, list) else [raw]:
        try:
            name, step, value, unix_time = item
            if type(name) is not str or type(step) is not int:
                continue
            points.append(_point(Point, (name, step, float(value), float(unix_time), rank_number)))
        except (ValueError, TypeError):
            continue
    return points


# Point(...) runs the named tuple's Python __new__ (~0.7 µs); tuple.__new__ makes the same object in C.
_point = tuple.__new__


def may_be_non_finite(payload: bytes) -> bool:
    """Whether an entry may hold a NaN or ±Infinity (bare, as json.dumps writes them, or as
    strings): such an entry is parsed whole and every rule sees it. A payload without a
    capital N or I (a one-byte memchr each) cannot; one with them is searched for the words."""
    return (b"N" in payload or b"I" in payload) and (b"NaN" in payload or b"Infinity" in payload)


class Row(msgspec.Struct, array_like=True, gc=False, forbid_unknown_fields=True):
    """One point as the SDK writes it, [name, step, value, time], decoded by msgspec: typed
    (a row of any other shape fails the decode) and untracked by the garbage collector. A
    list per point (json.loads, orjson) cost 3–4 times as much in the flusher's process:
    its allocations set off collections that walk Django's objects."""

    name: str
    step: int
    value: float
    time: float


_ROWS = msgspec.json.Decoder(list[Row])
_name, _step, _value, _time = (attrgetter(f) for f in ("name", "step", "value", "time"))


def payload_rows(payload: bytes) -> list[Row] | None:
    """An entry's points as Rows, or None when it is anything else (bare NaN/Infinity, a
    number out of range, a point of another shape, not JSON): the caller then parses it with
    json.loads (parse_points), which reads what it can of all of those."""
    try:
        return _ROWS.decode(payload)
    except msgspec.DecodeError:
        return None


def span_rows(payload: bytes, start: bytes, quoted: bytes) -> list[Row] | None:
    """The rows from the first to the last row of one metric (`start` is how JSON writes
    such a row's start, '["loss",'; `quoted` its name, '"loss"'), decoded: the SDK groups
    an entry's points by name (trainyard.protocol.metric_payload), so these are that
    metric's rows and no others are decoded. An entry not grouped gives the rows between
    too (the caller picks the metric's). [] when the metric is not in it; None when the
    payload must be decoded whole (the name written otherwise, a row msgspec refuses).
    A '["' can only open a row: inside a JSON string a quote is escaped."""
    first = payload.find(start)
    if first < 0:
        return None if quoted in payload else []
    if not payload.rstrip().endswith(b"]"):
        return None  # cut short: json.loads decides
    end = payload.find(b"]", payload.rfind(start) + len(start))  # numbers hold no "]"
    if end < 0:
        return None
    try:
        return _ROWS.decode(b"[" + payload[first:end + 1] + b"]")
    except msgspec.DecodeError:
        return None


def first_points_of(rows: list[Row], rank_number: int) -> list[Point]:
    """The first point of each metric among decoded rows, in the order the metrics first
    appear: the names and each name's first row come out of C loops."""
    names = list(map(_name, rows))
    earliest = dict(zip(reversed(names), reversed(rows), strict=True))  # later keys overwrite: the first wins
    return [_row_point(earliest[name], rank_number) for name in dict.fromkeys(names)]


def _row_point(row: Row, rank_number: int) -> Point:
    return _point(Point, (row.name, row.step, row.value, row.time, rank_number))


def _points_of(columns: dict[int, tuple[list[int], list[float], list[float]]], names: frozenset[str]) -> list[Point]:
    """Columns gathered so far as points (a later entry of the same read needs the slow path)."""
    name = next(iter(names))
    points = [_point(Point, (name, step, value, at, rank))
              for rank, (steps, values, times) in columns.items() for step, value, at in zip(steps, values, times, strict=True)]
    columns.clear()
    return points


def columns_of(rows: list[Row], name: str, rank_number: int,
               columns: dict[int, tuple[list[int], list[float], list[float]]]) -> None:
    """Append one metric's rows to `columns` (rank → steps, values, times) without making a
    Point of any: one comprehension picks the metric's rows, and map (C loops) makes its columns."""
    chosen = [row for row in rows if row.name == name]
    if chosen:
        steps, values, times = columns.setdefault(rank_number, ([], [], []))
        steps.extend(map(_step, chosen))
        values.extend(map(_value, chosen))
        times.extend(map(_time, chosen))


def points_of(rows: list[Row], names: frozenset[str], rank_number: int) -> list[Point]:
    """The points of `names` among decoded rows, without making a Point of the others."""
    return [_row_point(row, rank_number) for row in rows if row.name in names]


def gpu_samples(fields: dict[bytes, bytes]) -> list[GpuSample]:
    """One sample per GPU of a system sample ("gpus": each GPU's %, by index); a sample
    from an agent that sends only the mean counts as GPU 0."""
    at = parse_number(fields.get(b"t"))
    if at is None:
        return []
    host = text(fields.get(b"n", b""))
    each = [parse_number(part) for part in text(fields.get(b"gpus", b"")).split(",") if part]
    if each:
        return [GpuSample(host=host, gpu_index=index, utilization=value, time=at)
                for index, value in enumerate(each) if value is not None]
    mean = parse_number(fields.get(b"gpu"))
    return [GpuSample(host=host, gpu_index=0, utilization=mean, time=at)] if mean is not None else []


def job_costs(job_id: int) -> tuple[float | None, float | None]:
    """(cost so far, projected cost) for a budget rule; (None, None) when unknown."""
    try:
        from jobs.cost import job_cost

        figures = job_cost(TrainingJob.objects.get(pk=job_id))
    except Exception:  # noqa: BLE001 - no cost, no budget verdict; the rule says it has no data
        log.debug("job %s: no cost figures", job_id, exc_info=True)
        return None, None
    cost, projected = figures.get("cost"), figures.get("projected_cost")
    return (float(cost) if cost is not None else None), (float(projected) if projected is not None else None)


def run_watcher(stop: threading.Event, *, block_ms: int = 100, watcher: RuleWatcher | None = None) -> RuleWatcher:
    """Watch until `stop` is set (the flusher's command runs this on a thread). A failing
    cycle is logged and retried with back-off; unacked entries are read again."""
    watcher = watcher or RuleWatcher()
    backoff = 0.0
    try:
        while not stop.is_set():
            if not connection.in_atomic_block:
                close_old_connections()
            try:
                watcher.cycle(block_ms)
                backoff = 0.0
            except Exception:  # noqa: BLE001 - the watcher outlives any one bad cycle
                backoff = min(10.0, max(0.5, backoff * 2))
                log.exception("rule watcher cycle failed; retrying in %.1f s", backoff)
                watcher._recovering = True
                stop.wait(backoff)
    finally:
        watcher.resign()
        connection.close()
    return watcher


def start_watcher_thread(stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=run_watcher, args=(stop,), name="rule-watcher", daemon=True)
    thread.start()
    return thread
