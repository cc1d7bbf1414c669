"""Log history of a job, a page at a time.

The node agent writes each rank's output to `<output_uri>/logs/rank-<N>.log` (the
launcher's own lines to `launcher-node-<N>.log`) every few seconds and at exit, and
publishes live lines on LOGS_STREAM. A page is read from the file when it exists — the
cursor is then a byte offset — and from the Redis stream before the first upload — the
cursor is then a stream id. The response says which (`cursor_kind`), so a client just
hands the cursor back.

Range reads: a local file is seeked; an S3 object is read with a Range request, so a
page of a 1 GB log costs one page, not the whole object.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from datasets.storage import LocalStore, StorageError, join_uri, object_uri, split_uri, store_for
from jobs.metrics import STREAM_ID, parse_number, text
from jobs.models import TrainingJob
from trainyard.protocol import LOGS_STREAM, key

LAUNCHER_RANK = -1
DEFAULT_LINES = 1000
MAX_LINES = 5000
MAX_PAGE_BYTES = 1024 * 1024
TAIL_BYTES_PER_LINE = 256  # a first guess for ?tail=N, widened when lines are longer
STREAM_SCAN_ENTRIES = 20_000  # one page never scans more of the stream than this


@dataclass
class LogPage:
    lines: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
    cursor_kind: str = "bytes"  # "bytes": an offset into the file; "stream": a Redis stream id
    complete: bool = False  # the job finished and this page reached the end of its log
    source: str = "file"  # "file" or "stream"

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "next_cursor": self.next_cursor, "cursor_kind": self.cursor_kind,
                "complete": self.complete, "source": self.source}


def log_uri(job: TrainingJob, rank: int) -> str:
    # The same default output location the node agent uses when the job names none.
    output = (job.output_uri or object_uri(f"jobs/{job.pk}")).rstrip("/")
    name = "launcher-node-0.log" if rank == LAUNCHER_RANK else f"rank-{rank}.log"
    return join_uri(output, "logs", name)


def read_range(uri: str, offset: int, length: int) -> tuple[bytes, int] | None:
    """(bytes from `offset`, up to `length`; the object's size), or None when the object
    does not exist (yet)."""
    store = store_for(uri)
    if isinstance(store, LocalStore):
        path = store.path_for(uri)
        try:
            with open(path, "rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(min(offset, size))
                return handle.read(length), size
        except (FileNotFoundError, IsADirectoryError):
            return None
    from botocore.exceptions import ClientError

    _, bucket, object_key = split_uri(uri)
    try:
        reply = store.client.get_object(Bucket=bucket, Key=object_key, Range=f"bytes={offset}-{offset + length - 1}")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404"):
            return None
        if code == "InvalidRange":  # offset at or past the end
            head = store.client.head_object(Bucket=bucket, Key=object_key)
            return b"", int(head["ContentLength"])
        raise StorageError(f"{uri}: S3 error {code}: {exc}") from exc
    with contextlib.closing(reply["Body"]) as body:
        data = body.read()
    total = reply.get("ContentRange", "").rpartition("/")[2]
    return data, int(total) if total.isdigit() else offset + len(data)


def read_file_page(job: TrainingJob, rank: int, offset: int, limit: int) -> LogPage | None:
    """Up to `limit` whole lines from byte `offset`; None when the file is not there yet."""
    uri = log_uri(job, rank)
    chunk = read_range(uri, offset, MAX_PAGE_BYTES)
    if chunk is None:
        return None
    data, size = chunk
    finished = job.is_finished()
    pieces = data.split(b"\n")
    # The last piece has no newline yet: a line still being written, unless the file is
    # final (job finished, and we are at its end) — then it is the last line.
    at_end = offset + len(data) >= size
    partial = pieces.pop()
    consumed = 0
    lines = []
    for piece in pieces[:limit]:
        lines.append({"rank": rank, "text": piece.decode("utf-8", "replace")})
        consumed += len(piece) + 1
    if partial and len(lines) < limit and at_end and finished:
        lines.append({"rank": rank, "text": partial.decode("utf-8", "replace")})
        consumed += len(partial)
    if not lines and partial and len(data) >= MAX_PAGE_BYTES:
        # One line longer than a page: hand it over in pieces rather than stall forever.
        lines.append({"rank": rank, "text": partial.decode("utf-8", "replace")})
        consumed = len(data)
    next_offset = min(offset, size) + consumed
    return LogPage(lines=lines, next_cursor=str(next_offset), cursor_kind="bytes",
                   complete=finished and next_offset >= size, source="file")


def tail_file(job: TrainingJob, rank: int, count: int) -> LogPage | None:
    """The last `count` lines of the file; next_cursor is its end (to follow it)."""
    uri = log_uri(job, rank)
    head = read_range(uri, 0, 0)
    if head is None:
        return None
    size = head[1]
    window = min(size, max(count * TAIL_BYTES_PER_LINE, 64 * 1024))
    while True:
        start = size - window
        chunk = read_range(uri, start, window)
        if chunk is None:
            return None
        data = chunk[0]
        pieces = data.split(b"\n")
        if data.endswith(b"\n"):
            pieces.pop()
        if start > 0:
            pieces = pieces[1:]  # the first piece may be the end of an earlier line
        if len(pieces) >= count or start == 0 or window >= MAX_PAGE_BYTES * 4:
            break
        window = min(size, window * 4)
    lines = [{"rank": rank, "text": p.decode("utf-8", "replace")} for p in pieces[-count:]]
    return LogPage(lines=lines, next_cursor=str(size), cursor_kind="bytes", complete=job.is_finished(), source="file")


def _stream_line(entry_id: bytes, fields: dict[bytes, bytes]) -> dict[str, Any]:
    rank = fields.get(b"r", b"0")
    return {"rank": int(rank) if text(rank).lstrip("-").isdigit() else 0, "time": parse_number(fields.get(b"t")),
            "stream": text(fields.get(b"s", b"out")), "text": text(fields.get(b"l", b""))}


def read_stream_page(redis: Any, job: TrainingJob, rank: int | None, after: str, limit: int,
                     tail: int | None = None, until: str | None = None) -> LogPage:
    """Lines from LOGS_STREAM after stream id `after` (or the newest `tail` lines, at or
    before stream id `until` when given: where a live view's stream starts, so history and
    live lines meet without a gap or a repeat), of one rank or all (rank None). The stream
    is capped, so this is the recent past only."""
    stream = key(LOGS_STREAM, job.pk)
    lines: list[dict[str, Any]] = []
    last = after
    if tail is not None:
        scanned = 0
        newest: bytes | None = None
        end = until or "+"
        while len(lines) < tail and scanned < STREAM_SCAN_ENTRIES:
            entries = redis.xrevrange(stream, max=end, min="-", count=min(1000, STREAM_SCAN_ENTRIES - scanned))
            if not entries:
                break
            newest = newest or entries[0][0]
            scanned += len(entries)
            for entry_id, fields in entries:
                line = _stream_line(entry_id, fields)
                if rank is None or line["rank"] == rank:
                    lines.append(line)
                    if len(lines) >= tail:
                        break
            end = "(" + text(entries[-1][0])
        lines.reverse()
        last = text(newest) if newest else "0-0"
        return LogPage(lines=lines, next_cursor=last, cursor_kind="stream", complete=job.is_finished(), source="stream")
    scanned = 0
    exhausted = False
    while len(lines) < limit and scanned < STREAM_SCAN_ENTRIES:
        entries = redis.xrange(stream, min="(" + last if last != "0-0" else "-", max="+", count=min(1000, limit * 4))
        if not entries:
            exhausted = True
            break
        scanned += len(entries)
        for entry_id, fields in entries:
            line = _stream_line(entry_id, fields)
            if rank is None or line["rank"] == rank:
                lines.append(line)
            last = text(entry_id)
            if len(lines) >= limit:
                break
    return LogPage(lines=lines, next_cursor=last, cursor_kind="stream", complete=job.is_finished() and exhausted,
                   source="stream")


def parse_cursor(raw: str | None) -> tuple[str, int | str] | None:
    """("bytes", offset) or ("stream", id) from a client's cursor; None when absent.
    Raises ValueError for anything else."""
    if raw in (None, ""):
        return None
    assert raw is not None
    if raw.isdigit():
        return "bytes", int(raw)
    if STREAM_ID.match(raw) or raw == "0":
        return "stream", "0-0" if raw == "0" else raw
    raise ValueError(raw)
