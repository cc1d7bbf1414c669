"""Server-sent events for a job's page: `status`, `metric`, `log` and `system` events,
tailed from the job's four Redis streams with one XREAD.

Resuming without gaps or duplicates: every event's id is the position in all four
streams just after that event ("<events>,<metrics>,<logs>,<system>" stream ids). A client
that reconnects sends it back (EventSource does, as Last-Event-ID) and the tail goes on
from exactly there — each stream from its own position, so an event half-way through one
XREAD reply is never sent twice nor skipped. The streams keep recent entries only
(the flusher trims written metrics after STREAM_RETENTION_MS); older history comes from
the metrics and logs APIs.

Bounded: XREAD blocks at most a second, a comment line keeps proxies from closing an
idle connection, and a stream ends after MAX_STREAM_SECONDS (EventSource reconnects on
its own) or after a final `status` event once the job finished and the streams are drained.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections, connection

from jobs.metrics import STREAM_ID, parse_number, stream_items, text
from jobs.models import TrainingJob
from trainyard.protocol import EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

# The order of the positions in an event id.
STREAMS = (("status", EVENTS_STREAM), ("metric", METRICS_STREAM), ("log", LOGS_STREAM), ("system", SYSTEM_STREAM))
MAX_STREAM_SECONDS = 600
BLOCK_MS = 1000
KEEPALIVE_SECONDS = 15.0
STATUS_POLL_SECONDS = 2.0
ENTRIES_PER_READ = 200
RETRY_MS = 2000


def decode_positions(raw: str | None) -> list[str] | None:
    """The four stream positions of an event id, or None when it is not one of ours."""
    if not raw:
        return None
    parts = raw.strip().split(",")
    if len(parts) != len(STREAMS) or not all(STREAM_ID.match(p) for p in parts):
        return None
    return parts


def encode_positions(positions: list[str]) -> str:
    return ",".join(positions)


def current_positions(redis: Any, job_id: int) -> list[str]:
    """Each stream's newest id ("0-0" when empty): a fresh client starts from now."""
    pipe = redis.pipeline(transaction=False)
    for _, template in STREAMS:
        pipe.xrevrange(key(template, job_id), count=1)
    return [text(found[0][0]) if found else "0-0" for found in pipe.execute()]


def has_news(redis: Any, job_id: int, positions: list[str]) -> bool:
    streams = {key(template, job_id): position for (_, template), position in zip(STREAMS, positions, strict=True)}
    return any(entries for _, entries in stream_items(redis.xread(streams, count=1)))


def sse(kind: str, event_id: str, data: bytes | str) -> bytes:
    body = data.encode() if isinstance(data, str) else data
    return b"id: " + event_id.encode() + b"\nevent: " + kind.encode() + b"\ndata: " + body + b"\n\n"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def metric_data(fields: dict[bytes, bytes]) -> bytes | None:
    """{"rank": r, "points": [[name, step, value, time], ...]}. The SDK's JSON passes
    through untouched when it is safe to: no NaN/Infinity (browsers' JSON.parse refuses
    them) and no raw line breaks (which would end the SSE event early)."""
    rank, points = fields.get(b"r"), fields.get(b"p")
    if rank is None or points is None or not text(rank).lstrip("-").isdigit():
        return None
    if b"NaN" in points or b"Infinity" in points or b"\n" in points or b"\r" in points or not points.startswith(b"["):
        try:
            points = json.dumps(_clean(json.loads(points)), allow_nan=False).encode()
        except (ValueError, RecursionError):  # RecursionError: brackets nested past json's depth
            return None
    return b'{"rank": ' + str(int(rank)).encode() + b', "points": ' + points + b"}"


def log_data(fields: dict[bytes, bytes]) -> bytes:
    rank = text(fields.get(b"r", b"0"))
    return json.dumps({"rank": int(rank) if rank.lstrip("-").isdigit() else 0, "time": parse_number(fields.get(b"t")),
                       "stream": text(fields.get(b"s", b"out")), "line": text(fields.get(b"l", b""))}).encode()


def system_data(fields: dict[bytes, bytes]) -> bytes:
    return json.dumps({"node": text(fields.get(b"n", b"")), "time": parse_number(fields.get(b"t")),
                       "cpu": parse_number(fields.get(b"cpu")), "mem": parse_number(fields.get(b"mem")),
                       "gpu": parse_number(fields.get(b"gpu")), "gpu_mem": parse_number(fields.get(b"gpu_mem"))}).encode()


def status_data(fields: dict[bytes, bytes]) -> bytes:
    return json.dumps({"status": text(fields.get(b"status", b"")), "at": text(fields.get(b"at", b"")),
                       "message": text(fields.get(b"message", b""))}).encode()


def job_status(job_id: int) -> dict[str, Any] | None:
    row = (TrainingJob.objects.filter(pk=job_id)
           .values("status", "failure_reason", "stop_reason", "finished_at", "final_metrics").first())
    if row is None:
        return None
    finished_at = row["finished_at"]
    return {**row, "finished": row["status"] in ("Completed", "Stopped", "Failed"),
            "finished_at": finished_at.isoformat() if finished_at else None}


def _status_between_reads(job_id: int) -> dict[str, Any] | None:
    """job_status, then the thread's database connection is closed: a stream spends
    minutes blocked on Redis, and a connection held that long per open page would count
    against the database's connection limit (and keep test databases from being dropped)."""
    try:
        return job_status(job_id)
    finally:
        if not connection.in_atomic_block:
            connection.close()


FORMATTERS = {"status": status_data, "metric": metric_data, "log": log_data, "system": system_data}


def event_stream(redis: Any, job_id: int, positions: list[str], *, resumed: bool,
                 max_seconds: float = MAX_STREAM_SECONDS, block_ms: int = BLOCK_MS,
                 keepalive_seconds: float = KEEPALIVE_SECONDS) -> Iterator[bytes]:
    """1. Tell the client how soon to reconnect; a fresh client gets the current status.
    2. Tail the four streams, one event per entry, each with its resume id.
    3. Once the job is finished and nothing is left to read, send a final `status`
       (with the failure reason and final metrics) and end."""
    positions = list(positions)
    keys = [key(template, job_id) for _, template in STREAMS]
    kinds = {k: (index, kind) for index, (k, (kind, _)) in enumerate(zip(keys, STREAMS, strict=True))}
    started = time.monotonic()
    last_write = started
    last_status_check = started
    yield f"retry: {RETRY_MS}\n\n".encode()
    status = _status_between_reads(job_id)
    if status is None:
        return
    finishing = status["finished"]
    if not resumed and not finishing:
        yield sse("status", encode_positions(positions), json.dumps({**status, "final": False}, default=str))
    try:
        while time.monotonic() - started < max_seconds:
            # Once finishing, read without blocking: an empty reply means drained.
            reply = stream_items(redis.xread(dict(zip(keys, positions, strict=True)), count=ENTRIES_PER_READ,
                                             block=None if finishing else block_ms))
            sent = 0
            for raw_key, entries in reply:
                index, kind = kinds[text(raw_key)]
                for entry_id, fields in entries:
                    positions[index] = text(entry_id)
                    data = FORMATTERS[kind](fields)
                    if data is None:
                        continue
                    sent += 1
                    yield sse(kind, encode_positions(positions), data)
            now = time.monotonic()
            if sent:
                last_write = now
            elif now - last_write >= keepalive_seconds:
                last_write = now
                yield b": keep-alive\n\n"
            if finishing and not reply:
                status = _status_between_reads(job_id)
                if status is not None:
                    yield sse("status", encode_positions(positions), json.dumps({**status, "final": True}, default=str))
                return
            if not finishing and now - last_status_check >= STATUS_POLL_SECONDS:
                last_status_check = now
                # The database decides "finished" (the status event on Redis is best effort).
                status = _status_between_reads(job_id)
                if status is None:
                    return
                finishing = status["finished"]
    finally:
        # The stream's thread outlives Django's request signals' timing: tidy up here.
        if not connection.in_atomic_block:
            close_old_connections()
