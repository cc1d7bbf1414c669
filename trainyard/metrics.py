"""Metrics from inside a training process: `log_metric(name, value, step)`.

The call only appends to an in-memory buffer (a bounded deque) and returns; a daemon
thread sends the buffer to the job's Redis stream every ~100 ms, many points per XADD
entry (one XADD per point tops out near 57k points/s; packed, the server is not the
limit). The flusher in the studio writes the stream to the database.

Guarantees, in order of importance:
1. Never raise into the training loop: Redis down, a bad value, a full buffer — each is
   reported once on stderr and counted, never raised.
2. Bounded memory: at most `TRAINYARD_METRICS_BUFFER` points (default 1,000,000) wait;
   when Redis stays away longer, the oldest points are dropped and counted.
3. No loss on a normal exit: an atexit hook drains the buffer (up to a few seconds).

Outside a job (no TRAINYARD_JOB_ID / TRAINYARD_REDIS_URL) the points are kept in memory
(the last 10,000, see `MetricsLogger.recent()`) and nothing is sent.

This module must not import Django (it runs inside training scripts); redis-py is
imported lazily by the sending thread, so `import trainyard` stays cheap.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from trainyard.protocol import ACTIVE_METRIC_JOBS, ENV_JOB_ID, ENV_REDIS_URL, METRICS_STREAM, metric_payload

DEFAULT_BUFFER = 1_000_000
LOCAL_BUFFER = 10_000
FLUSH_INTERVAL_SECONDS = 0.1
# Wake the sender early when this many points wait, so a tight loop does not build up
# a backlog of a whole interval's worth at millions of points per second.
WAKE_THRESHOLD = 5_000
# ~40 bytes of JSON per point: 5,000 points is a ~200 KB entry, small enough for one SSE
# event, large enough that Redis round trips stop mattering.
POINTS_PER_ENTRY = 5_000
ENTRIES_PER_PIPELINE = 10
MAX_BACKOFF_SECONDS = 5.0
EXIT_FLUSH_SECONDS = 3.0

Point = tuple[str, int, float, float]  # (name, step, value, unix time)


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"trainyard: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr must not fail the caller either
        pass


class MetricsLogger:
    """One process's metric buffer and the thread that sends it.

    Most code uses the module functions, which share one logger built from the
    environment (`get_logger()`)."""

    def __init__(self, job_id: str | int | None = None, redis_url: str | None = None, *, rank: int = 0,
                 max_buffer: int = DEFAULT_BUFFER, flush_interval: float = FLUSH_INTERVAL_SECONDS) -> None:
        self.job_id = str(job_id) if job_id not in (None, "") else None
        self.redis_url = redis_url or None
        self.rank = rank
        self.enabled = self.job_id is not None and self.redis_url is not None
        self.max_buffer = max_buffer if self.enabled else min(max_buffer, LOCAL_BUFFER)
        self.flush_interval = flush_interval
        self.stream = METRICS_STREAM.format(job_id=self.job_id) if self.enabled else ""
        # deque.append with maxlen is atomic under the GIL: the training thread appends,
        # the sender pops from the other end, no lock on the hot path.
        self._buffer: deque[Point] = deque(maxlen=self.max_buffer)
        self._inflight: list[Point] = []  # popped but not yet accepted by Redis: resent first
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._started = False
        self._start_lock = threading.Lock()
        self._client: Any = None
        self._backoff = 0.0
        self._next_try = 0.0
        self.sent = 0
        self.dropped = 0
        self.rejected = 0
        self._warned_unreachable = False
        self._warned_dropping = False
        self._warned_rejected = False

    # --- the hot path ------------------------------------------------------------------
    def log_metric(self, name: str, value: Any, step: int) -> None:
        try:
            point = (name if type(name) is str else str(name), int(step), float(value), time.time())
        except Exception:  # noqa: BLE001 - a bad value is the caller's bug, but must not kill a run
            self._reject(name, value, step)
            return
        buffer = self._buffer
        if len(buffer) >= self.max_buffer and self.enabled:
            self.dropped += 1  # the append below pushes the oldest point out
        buffer.append(point)
        if not self._started and self.enabled:
            self._start()
        elif len(buffer) >= WAKE_THRESHOLD and not self._wake.is_set():
            self._wake.set()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        now = time.time()
        buffer = self._buffer
        for name, value in metrics.items():
            try:
                point = (name if type(name) is str else str(name), int(step), float(value), now)
            except Exception:  # noqa: BLE001 - see log_metric
                self._reject(name, value, step)
                continue
            if len(buffer) >= self.max_buffer and self.enabled:
                self.dropped += 1
            buffer.append(point)
        if not self._started and self.enabled:
            self._start()
        elif len(buffer) >= WAKE_THRESHOLD and not self._wake.is_set():
            self._wake.set()

    def _reject(self, name: Any, value: Any, step: Any) -> None:
        self.rejected += 1
        if not self._warned_rejected:
            self._warned_rejected = True
            _warn(f"log_metric({name!r}, {value!r}, step={step!r}): value must be a number and step an integer; "
                  "point skipped (further bad points are skipped silently)")

    # --- sending -----------------------------------------------------------------------
    def _start(self) -> None:
        with self._start_lock:
            if self._started:
                return
            # Import redis-py here, once, on the caller's thread: imported lazily by the
            # sender it may first be needed in the exit flush, when Python no longer lets
            # a module register its own exit hooks (concurrent.futures does).
            try:
                import redis  # noqa: F401
            except ImportError as exc:
                _warn(f"redis-py is not installed ({exc}); metrics cannot be sent")
            thread = threading.Thread(target=self._run, name="trainyard-metrics", daemon=True)
            # The first point goes out at once, not after a flush interval: it is what a
            # person watching a job that just started waits for (later ones are batched).
            self._wake.set()
            thread.start()
            self._started = True

    def _run(self) -> None:
        while True:
            wait = self.flush_interval
            if self._next_try:
                wait = max(wait, self._next_try - time.monotonic())
            self._wake.wait(wait)
            self._wake.clear()
            if not self._send_lock.acquire(timeout=1.0):
                continue  # flush() is draining synchronously
            try:
                if time.monotonic() >= self._next_try:
                    self._send_pending()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any bug
                _warn(f"metrics sender error ({exc!r}); retrying")
            finally:
                self._send_lock.release()

    def _connect(self) -> Any:
        if self._client is None:
            import redis

            # Short timeouts: a dead Redis must cost the exit flush seconds, not minutes.
            self._client = redis.Redis.from_url(self.redis_url or "", socket_connect_timeout=1.0, socket_timeout=2.0)
        return self._client

    def _send_pending(self) -> bool:
        """Send everything waiting; the caller holds _send_lock. False on a Redis error,
        with the unsent points kept (in order) for the next try."""
        while self._inflight or self._buffer:
            if not self._inflight:
                self._take_batch()
            try:
                self._send(self._inflight)
            except Exception as exc:  # noqa: BLE001 - any failure means "not delivered, retry"
                self._failed(exc)
                return False
            self.sent += len(self._inflight)
            self._inflight = []
            self._recovered()
        return True

    def _take_batch(self) -> None:
        limit = POINTS_PER_ENTRY * ENTRIES_PER_PIPELINE
        buffer = self._buffer
        batch: list[Point] = []
        append = batch.append
        popleft = buffer.popleft
        try:
            for _ in range(min(limit, len(buffer))):
                append(popleft())
        except IndexError:
            pass
        self._inflight = batch

    def _send(self, points: list[Point]) -> None:
        client = self._connect()
        pipe = client.pipeline(transaction=False)
        # Every time, not once: the flusher drops finished jobs from the set, and a
        # straggler's points must still be found.
        pipe.sadd(ACTIVE_METRIC_JOBS, self.job_id)
        rank = str(self.rank)
        for start in range(0, len(points), POINTS_PER_ENTRY):
            pipe.xadd(self.stream, {"r": rank, "p": metric_payload(points[start:start + POINTS_PER_ENTRY])})
        pipe.execute()

    def _failed(self, exc: Exception) -> None:
        self._backoff = min(MAX_BACKOFF_SECONDS, max(0.1, self._backoff * 2))
        self._next_try = time.monotonic() + self._backoff
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if not self._warned_unreachable:
            self._warned_unreachable = True
            _warn(f"cannot send metrics to Redis at {self.redis_url} ({exc.__class__.__name__}: {exc}); keeping up "
                  f"to {self.max_buffer:,} points in memory and retrying")
        if self.dropped and not self._warned_dropping:
            self._warned_dropping = True
            _warn(f"metric buffer full ({self.max_buffer:,} points): dropping the oldest points")

    def _recovered(self) -> None:
        if self._backoff:
            _warn(f"metrics reach Redis again; {self.dropped:,} points were dropped while it was unreachable")
        self._backoff = 0.0
        self._next_try = 0.0
        self._warned_unreachable = False
        self._warned_dropping = False

    # --- draining ----------------------------------------------------------------------
    def pending(self) -> int:
        """Points not yet accepted by Redis."""
        return len(self._buffer) + len(self._inflight) if self.enabled else 0

    def flush(self, timeout: float = 10.0) -> bool:
        """Send everything logged so far, waiting up to `timeout` seconds. True when the
        buffer is empty (always True outside a job). Never raises."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self.pending() == 0
            if self._send_lock.acquire(timeout=remaining):
                try:
                    if self._send_pending():
                        return True
                except Exception as exc:  # noqa: BLE001
                    _warn(f"metrics flush error ({exc!r})")
                finally:
                    self._send_lock.release()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def recent(self) -> list[Point]:
        """The points still in memory (outside a job: the last 10,000 logged)."""
        return list(self._buffer)


_default: MetricsLogger | None = None
_default_lock = threading.Lock()


def _rank_from_env() -> int:
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


def _buffer_from_env() -> int:
    try:
        return max(1, int(os.environ.get("TRAINYARD_METRICS_BUFFER", DEFAULT_BUFFER)))
    except ValueError:
        return DEFAULT_BUFFER


def get_logger() -> MetricsLogger:
    """The process's logger, configured from TRAINYARD_JOB_ID, TRAINYARD_REDIS_URL and RANK."""
    global _default
    logger = _default
    if logger is None:
        with _default_lock:
            if _default is None:
                _default = MetricsLogger(os.environ.get(ENV_JOB_ID), os.environ.get(ENV_REDIS_URL), rank=_rank_from_env(),
                                         max_buffer=_buffer_from_env())
            logger = _default
    return logger


def log_metric(name: str, value: float, step: int) -> None:
    """Record `value` of metric `name` at `step`. Returns at once; never raises."""
    logger = _default
    if logger is None:
        logger = get_logger()
    logger.log_metric(name, value, step)


def log_metrics(metrics: Mapping[str, float], step: int) -> None:
    """Record several metrics at one step, e.g. `log_metrics({"loss": l, "acc": a}, step)`."""
    logger = _default
    if logger is None:
        logger = get_logger()
    logger.log_metrics(metrics, step)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every point logged so far reached Redis (or `timeout`). True if all did."""
    return _default.flush(timeout) if _default is not None else True


def _flush_at_exit() -> None:
    logger = _default
    if logger is None or not logger.enabled or logger.pending() == 0:
        return
    if not logger.flush(EXIT_FLUSH_SECONDS):
        _warn(f"{logger.pending():,} metric points could not be sent before exit")


def _reset_after_fork() -> None:
    # A forked child (a DataLoader worker) has a copy of the parent's buffer and no
    # sender thread: the parent sends those points; the child starts afresh.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


atexit.register(_flush_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
