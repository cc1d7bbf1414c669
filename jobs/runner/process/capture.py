"""The launcher's output, line by line: which rank said it, when, on which stream.

Every line goes to (1) the rank's log file in the job directory, capped at
STUDIO_LOG_MAX_BYTES with a note when cut and the rank's last lines appended at the end,
(2) the live log stream in Redis (LOGS_STREAM, capped per line and in length), (3) the
job's `metric_definitions` regexes, whose matches go to METRICS_STREAM packed the way the
SDK packs them, and (4) a short per-rank stderr tail kept for failure reasons.

The readers never block on anything but the pipe: Redis gets lines through a bounded
queue (full → dropped from the live view, never from the file), and a capped log keeps
being read (metrics and the stderr tail still see every line), so a job's output can never
fill its pipe and stall it, nor fill the node's disk.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from jobs.patterns import MATCH_TIMEOUT_SECONDS, PatternTimeout, compile_pattern
from jobs.patterns import error as PatternError
from trainyard.protocol import ACTIVE_METRIC_JOBS, LOG_STREAM_MAXLEN, LOGS_STREAM, METRICS_STREAM, key, metric_payload

log = logging.getLogger(__name__)

LAUNCHER_RANK = -1  # lines of torchrun itself (no rank prefix)
READ_CHUNK = 64 * 1024  # longer lines arrive in pieces of this size, never as one huge buffer
LIVE_LINE_CHARS = 4096  # a log entry in Redis carries at most this much of a line
LIVE_QUEUE_LINES = 20_000
STDERR_TAIL_LINES = 50
LAUNCHER_TAIL_LINES = 300
CUT_TAIL_LINES = 200
CUT_TAIL_BYTES = 256 * 1024
METRIC_MATCH_CHARS = 4096  # regexes see at most this much of a line (bounded cost per line)
METRIC_TIMEOUTS_ALLOWED = 3  # lines a definition's regex may run out of time on before it is dropped
POINTS_PER_ENTRY = 5_000
PUBLISH_INTERVAL_SECONDS = 0.2
TEARDOWN_ABORT = "terminate called without an active exception"
# A line's own step: "step=120 train_loss=0.31" (what the built-in algorithms print beside
# the points they send through the SDK; same step, so the two never make two points).
_STEP_TOKEN = re.compile(r"(?:^|\s)step=(\d+)(?:\s|$)")
# The launcher's traceback when it ends on the stop's SIGTERM (torch's elastic agent turns
# the signal into an exception it re-raises): a stop is not a crash, so once a stop is under
# way such a traceback is replaced by one line saying so (any other traceback is kept whole).
HELD_TRACEBACK_LINES = 2_000  # a longer one is logged as it came
_TRACEBACK_START = "Traceback (most recent call last):"
_SIGNAL_EXCEPTION = re.compile(r"^[\w.]*SignalException: (?P<what>.*)$")
# "[rank3]:" (our template, global rank) or torchrun's default "[trainer0]:" (local rank).
_PREFIX = re.compile(r"^\[(?:rank|[A-Za-z_][\w-]*?)(\d+)\]:")


def split_prefix(line: str) -> tuple[int, str]:
    """(rank, text) of a line of the launcher's output; LAUNCHER_RANK for its own lines."""
    match = _PREFIX.match(line)
    if match is None:
        return LAUNCHER_RANK, line
    return int(match.group(1)), line[match.end():]


# --- metric definitions -----------------------------------------------------------------------
@dataclass(frozen=True)
class MetricRule:
    name: str
    pattern: Any  # jobs.patterns.compile_pattern's: matched with a time limit, the GIL released
    value_group: int | str
    has_step: bool

    def match(self, text: str) -> tuple[float, int | None] | None:
        """(value, step or None) of a matching line; raises PatternTimeout (jobs.patterns)."""
        found = self.pattern.search(text[:METRIC_MATCH_CHARS])
        if found is None:
            return None
        try:
            value = float(found.group(self.value_group))
            step = int(float(found.group("step"))) if self.has_step else None
        except (TypeError, ValueError, IndexError):
            return None
        return value, step


def compile_metric_rules(definitions: Iterable[dict]) -> tuple[list[MetricRule], list[str]]:
    """Rules from [{"name", "regex"}]: the value is the group named `value`, else the first
    group that is not `step`; an optional group `step` gives the step. Returns (rules,
    problems); a bad definition is reported and skipped, never fatal."""
    rules: list[MetricRule] = []
    problems: list[str] = []
    for definition in definitions or []:
        name, regex = str(definition.get("name", "")), str(definition.get("regex", ""))
        try:
            pattern = compile_pattern(regex)
        except PatternError as exc:
            problems.append(f"metric {name!r}: bad regex {regex!r} ({exc}); ignored")
            continue
        names_by_index = {index: group for group, index in pattern.groupindex.items()}
        if "value" in pattern.groupindex:
            value_group: int | str = "value"
        else:
            candidates = [i for i in range(1, pattern.groups + 1) if names_by_index.get(i) != "step"]
            if not candidates:
                problems.append(f"metric {name!r}: regex {regex!r} has no capture group for the value; ignored")
                continue
            value_group = candidates[0]
        rules.append(MetricRule(name, pattern, value_group, "step" in pattern.groupindex))
    return rules, problems


# --- live publishing --------------------------------------------------------------------------
class LivePublisher(threading.Thread):
    """Sends log lines and metric points to Redis in batches (one pipeline per batch).
    Redis being away costs the live view those lines, never the job: the queue is
    bounded and `put_line` never waits."""

    def __init__(self, redis: Any, job_id: int, node_rank: int) -> None:
        super().__init__(name=f"live-{job_id}", daemon=True)
        self.redis = redis
        self.job_id = job_id
        self.node_rank = node_rank
        self.lines: queue.Queue[dict] = queue.Queue(maxsize=LIVE_QUEUE_LINES)
        self._points: dict[int, list[list]] = {}
        self._points_lock = threading.Lock()
        self._stopping = threading.Event()
        self.dropped_lines = 0
        self.sent_points = 0
        self._warned = False

    def put_line(self, rank: int, at: float, source: str, text: str) -> None:
        entry = {"r": rank, "t": f"{at:.3f}", "s": source, "l": text[:LIVE_LINE_CHARS], "n": self.node_rank}
        try:
            self.lines.put_nowait(entry)
        except queue.Full:
            self.dropped_lines += 1

    def put_point(self, rank: int, name: str, step: int, value: float, at: float) -> None:
        with self._points_lock:
            self._points.setdefault(rank, []).append([name, step, value, at])

    def run(self) -> None:
        while not self._stopping.wait(PUBLISH_INTERVAL_SECONDS):
            self.flush()
        self.flush()

    def flush(self) -> None:
        lines: list[dict] = []
        with contextlib.suppress(queue.Empty):
            while len(lines) < LIVE_QUEUE_LINES:
                lines.append(self.lines.get_nowait())
        with self._points_lock:
            points, self._points = self._points, {}
        if not lines and not points:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            logs = key(LOGS_STREAM, self.job_id)
            for entry in lines:
                pipe.xadd(logs, entry, maxlen=LOG_STREAM_MAXLEN, approximate=True)
            for rank, rank_points in points.items():
                for start in range(0, len(rank_points), POINTS_PER_ENTRY):
                    chunk = rank_points[start:start + POINTS_PER_ENTRY]
                    pipe.xadd(key(METRICS_STREAM, self.job_id), {"r": rank, "p": metric_payload(chunk)})
            if points:
                pipe.sadd(ACTIVE_METRIC_JOBS, self.job_id)
            pipe.execute()
            self.sent_points += sum(len(p) for p in points.values())
        except Exception as exc:  # noqa: BLE001 - Redis away: the files keep everything
            self.dropped_lines += len(lines)
            if not self._warned:
                self._warned = True
                log.warning("job %s: live logs/metrics could not reach Redis (%s); the log files keep everything",
                            self.job_id, exc)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)


# --- per-rank log files -----------------------------------------------------------------------
class RankLog:
    """One rank's log file: everything up to the cap, then a note, then (at close) the
    rank's last lines — the end of a log (the traceback) matters as much as its start."""

    def __init__(self, path: Path, rank: int, max_bytes: int) -> None:
        self.path = path
        self.rank = rank
        self.max_bytes = max_bytes
        self.written = 0
        self.cut = False
        self.dropped = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self.closed = False
        self._file = open(path, "ab")  # noqa: SIM115 - lives as long as the capture

    def write(self, text: str) -> str | None:
        """Writes the line; returns the note line when this line is the one that cuts."""
        if self.closed:
            return None  # a note after the end: the live view still gets it
        data = (text + "\n").encode("utf-8", "replace")
        if not self.cut and self.written + len(data) <= self.max_bytes:
            self._file.write(data)
            self.written += len(data)
            return None
        self.dropped += 1
        self._tail.append(data)
        self._tail_bytes += len(data)
        while len(self._tail) > CUT_TAIL_LINES or self._tail_bytes > CUT_TAIL_BYTES:
            self._tail_bytes -= len(self._tail.popleft())
        if self.cut:
            return None
        self.cut = True
        note = f"[trainyard] log cut: further output of rank {self.rank} dropped"
        if self.rank == LAUNCHER_RANK:
            note = "[trainyard] log cut: further output of the launcher dropped"
        self._file.write((note + "\n").encode())
        return note

    def flush(self) -> None:
        if not self.closed:
            self._file.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.cut and self._tail:
            dropped_before_tail = self.dropped - len(self._tail)
            self._file.write((f"[trainyard] log resumed: {dropped_before_tail} line(s) were dropped; the last "
                              f"{len(self._tail)} line(s) follow\n").encode())
            self._file.writelines(self._tail)
        self._file.close()


@dataclass
class RankState:
    log: RankLog
    stderr_tail: deque[str]
    metric_counts: dict[str, int]


class OutputCapture:
    """Reads the launcher's stdout and stderr pipes, one thread each."""

    def __init__(self, *, logs_dir: Path, max_bytes: int, rules: list[MetricRule], publisher: LivePublisher | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.logs_dir = logs_dir
        self.max_bytes = max_bytes
        self.rules = rules
        self.publisher = publisher
        self.clock = clock
        self.ranks: dict[int, RankState] = {}
        self.launcher_tail: deque[str] = deque(maxlen=LAUNCHER_TAIL_LINES)
        self.teardown_abort_ranks: set[int] = set()
        self.stopping = False  # set by expect_stop(): the launcher is about to get SIGTERM
        self._held: dict[str, list[tuple[str, float]]] = {}  # a launcher traceback read while stopping, per pipe
        self.lines = 0
        self._timeouts: dict[str, int] = {}  # per metric definition: lines its regex ran out of time on
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def log_path(self, rank: int) -> Path:
        return self.logs_dir / ("launcher.log" if rank == LAUNCHER_RANK else f"rank-{rank}.log")

    def start(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        for stream, source in ((stdout, "out"), (stderr, "err")):
            thread = threading.Thread(target=self._read, args=(stream, source), name=f"capture-{source}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float) -> bool:
        """True when both pipes reached their end (every writer is gone)."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _read(self, stream: IO[bytes], source: str) -> None:
        try:
            while raw := stream.readline(READ_CHUNK):
                self.feed(raw.decode("utf-8", "replace").rstrip("\r\n"), source, self.clock())
            self._release_held(source)
        except (OSError, ValueError):  # the pipe was closed under us: the job is over
            self._release_held(source)
        except Exception:  # noqa: BLE001 - a capture bug must not leave the pipe unread (the job would block)
            log.exception("output capture failed; draining the rest of the %s pipe", source)
            with contextlib.suppress(OSError, ValueError):
                while stream.read(READ_CHUNK):
                    pass

    def expect_stop(self) -> None:
        """The job is being stopped: a traceback of the launcher that ends in torch's
        SignalException is the stop itself, and is logged as one line."""
        self.stopping = True

    def _hold(self, text: str, source: str, at: float) -> bool:
        """While stopping, keep back the launcher's traceback lines until the exception's
        line shows what it is. True when the line was taken (held or replaced)."""
        held = self._held.get(source)
        if held is None:
            if not self.stopping or text != _TRACEBACK_START:
                return False
            self._held[source] = [(text, at)]
            return True
        held.append((text, at))
        if (text[:1] in (" ", "\t") or not text) and len(held) < HELD_TRACEBACK_LINES:
            return True
        del self._held[source]
        match = _SIGNAL_EXCEPTION.match(text)
        if match is not None:
            self._feed_line(LAUNCHER_RANK, f"[trainyard] the launcher ended on the stop's signal ({match['what']}); "
                            "its traceback is left out", source, at)
        else:
            for line, line_at in held:
                self._feed_line(LAUNCHER_RANK, line, source, line_at)
        return True

    def _release_held(self, source: str | None = None) -> None:
        """A traceback cut short (its pipe ended mid-way) is logged as it came."""
        for held_source in [source] if source is not None else list(self._held):
            for line, at in self._held.pop(held_source, []):
                self._feed_line(LAUNCHER_RANK, line, held_source, at)

    def note(self, text: str, rank: int = LAUNCHER_RANK) -> None:
        """A line of our own (staging done, limits hit) in the log and the live view."""
        self.feed(f"[trainyard] {text}" if rank == LAUNCHER_RANK else text, "err", self.clock(), rank=rank)

    def feed(self, line: str, source: str, at: float, rank: int | None = None) -> None:
        if rank is None:
            rank, text = split_prefix(line)
            if rank == LAUNCHER_RANK and (self.stopping or self._held) and self._hold(text, source, at):
                return
        else:
            text = line
        self._feed_line(rank, text, source, at)

    def _feed_line(self, rank: int, text: str, source: str, at: float) -> None:
        with self._lock:
            self.lines += 1
            state = self._state(rank)
            cut_note = state.log.write(text)
            if rank == LAUNCHER_RANK:
                self.launcher_tail.append(text)
            elif source == "err":
                state.stderr_tail.append(text)
                if TEARDOWN_ABORT in text:
                    self.teardown_abort_ranks.add(rank)
            points, dropped = self._match_metrics(state, text) if rank != LAUNCHER_RANK else ([], [])
        for rule in dropped:
            self.note(f"metric {rule.name!r}: its regex {rule.pattern.pattern!r} ran out of time "
                      f"({METRIC_TIMEOUTS_ALLOWED} lines took over {MATCH_TIMEOUT_SECONDS} s each: it backtracks "
                      f"without end); it reads no more lines of this job")
        if self.publisher is not None:
            if not state.log.cut:
                self.publisher.put_line(rank, at, source, text)
            elif cut_note:
                self.publisher.put_line(rank, at, "err", cut_note)
            for name, step, value in points:
                self.publisher.put_point(rank, name, step, value, at)

    def _state(self, rank: int) -> RankState:
        state = self.ranks.get(rank)
        if state is None:
            state = RankState(RankLog(self.log_path(rank), rank, self.max_bytes), deque(maxlen=STDERR_TAIL_LINES), {})
            self.ranks[rank] = state
        return state

    def _match_metrics(self, state: RankState, text: str) -> tuple[list[tuple[str, int, float]], list[MetricRule]]:
        """The line's points, and the definitions dropped on it (their regex ran out of time
        once too often: matched against no further line)."""
        points = []
        dropped: list[MetricRule] = []
        line_step: int | None = None
        for rule in self.rules:
            try:
                found = rule.match(text)
            except PatternTimeout:
                self._timeouts[rule.name] = self._timeouts.get(rule.name, 0) + 1
                if self._timeouts[rule.name] >= METRIC_TIMEOUTS_ALLOWED:
                    dropped.append(rule)
                continue
            if found is None:
                continue
            value, step = found
            if step is None:
                # Without a step group: the line's `step=N` token, else the match's ordinal.
                if line_step is None:
                    token = _STEP_TOKEN.search(text[:METRIC_MATCH_CHARS])
                    line_step = int(token.group(1)) if token else -1
                step = line_step if line_step >= 0 else state.metric_counts.get(rule.name, 0)
            state.metric_counts[rule.name] = state.metric_counts.get(rule.name, 0) + 1
            # "nan", "inf", "-Infinity" (any case) are sent as the SDK sends them: a printed
            # `loss=nan` is what the rule non_finite is there to stop; the store and the live
            # view turn them into their own forms (the database keeps no NaN).
            points.append((rule.name, step, value))
        if dropped:
            self.rules = [rule for rule in self.rules if rule not in dropped]
        return points, dropped

    def stderr_tail(self, rank: int) -> list[str]:
        with self._lock:
            state = self.ranks.get(rank)
            return list(state.stderr_tail) if state else []

    def log_files(self) -> list[Path]:
        with self._lock:
            for state in self.ranks.values():
                state.log.flush()
            return [state.log.path for state in self.ranks.values()]

    def close(self) -> None:
        self._release_held()
        with self._lock:
            for state in self.ranks.values():
                state.log.close()
