"""Pieces every format reader shares: the hashing byte source, strict UTF-8 line chunks
with physical line numbers, capped error collection, and per-column statistics."""

from __future__ import annotations

import hashlib
import io
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

CHUNK_BYTES = 1024 * 1024
# A "line" longer than this means the file is not what its name says (a binary file, a
# minified blob); stopping keeps memory bounded instead of buffering the whole file.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_ERRORS = 100
DISTINCT_CAP = 1000
CLASSES_CAP = 1000
PREVIEW_ROWS = 20
PREVIEW_TEXT_CHARS = 500
BATCH_ROWS = 4096
LABEL_NAMES = ("label", "target", "class", "y", "category")
BOOLEAN_WORDS = frozenset({"true", "false"})
UTF8_BOM = b"\xef\xbb\xbf"


class ErrorLog:
    """Keeps the first MAX_ERRORS problems and counts the rest, so a file with a million
    bad rows still yields a small report that says how bad it is."""

    def __init__(self) -> None:
        self.kept: list[dict] = []
        self.total = 0

    def add(self, file: str, line: int | None, message: str) -> None:
        self.total += 1
        if len(self.kept) < MAX_ERRORS:
            self.kept.append({"file": file, "line": line, "message": message})

    def as_list(self) -> list[dict]:
        cut = self.total - len(self.kept)
        if cut <= 0:
            return list(self.kept)
        return [*self.kept, {"file": "", "line": None, "message": f"{cut} more errors not shown"}]


class ByteSource:
    """Reads one stream front to back exactly once, hashing and counting every byte on
    the way, so the content hash costs no second pass and S3 bodies never need a seek."""

    def __init__(self, stream: BinaryIO, on_bytes: Callable[[int], None]) -> None:
        self._stream = stream
        self._on_bytes = on_bytes
        self._pending = b""
        self._eof = False
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read_chunk(self) -> bytes:
        """The next chunk (at most CHUNK_BYTES), b"" at the end."""
        if self._pending:
            chunk, self._pending = self._pending, b""
            return chunk
        if self._eof:
            return b""
        chunk = self._stream.read(CHUNK_BYTES)
        if not chunk:
            self._eof = True
            return b""
        self.sha256.update(chunk)
        self.size += len(chunk)
        self._on_bytes(len(chunk))
        return chunk

    def is_empty(self) -> bool:
        if self.size == 0 and not self._eof:
            self._pending = self.read_chunk()
        return self.size == 0

    def read_up_to(self, limit: int) -> bytes | None:
        """The whole rest of the stream, or None (stream drained) if it exceeds limit."""
        parts: list[bytes] = []
        total = 0
        while chunk := self.read_chunk():
            total += len(chunk)
            if total > limit:
                self.drain()
                return None
            parts.append(chunk)
        return b"".join(parts)

    def drain(self) -> None:
        """Read what a reader left (after a fatal error) so the hash covers the file."""
        while self.read_chunk():
            pass

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def iter_text_chunks(source: ByteSource, path: str, errors: ErrorLog) -> Iterator[tuple[int, str]]:
    """Yield (number of the chunk's first physical line, text made of whole lines).

    Every chunk but the last ends with "\\n". Decoding is strict: a line with bytes that
    are not UTF-8 is reported with its line number and byte position, then passed on
    with replacement characters so later lines keep their numbers. Splitting on b"\\n"
    is safe because that byte never occurs inside a multi-byte UTF-8 sequence.
    """
    head = source.read_chunk()
    # A stream may hand back a few bytes at a time; a BOM can straddle two reads.
    while head and len(head) < len(UTF8_BOM) and UTF8_BOM.startswith(head):
        more = source.read_chunk()
        if not more:
            break
        head += more
    if head.startswith(UTF8_BOM):
        head = head[len(UTF8_BOM):]
    next_line = 1
    carry = b""
    for chunk in itertools.chain((head,), iter(source.read_chunk, b"")):
        buffer = carry + chunk if carry else chunk
        cut = buffer.rfind(b"\n")
        if cut < 0:
            carry = buffer
            if len(carry) > MAX_LINE_BYTES:
                errors.add(path, next_line, f"line is longer than {MAX_LINE_BYTES // 2**20} MiB; "
                           "stopped reading this file (is it really text?)")
                source.drain()
                return
            continue
        whole, carry = buffer[: cut + 1], buffer[cut + 1:]
        yield next_line, _decode_lines(whole, next_line, path, errors)
        next_line += whole.count(b"\n")
    if carry:
        yield next_line, _decode_lines(carry, next_line, path, errors)


def _decode_lines(data: bytes, first_line: int, path: str, errors: ErrorLog) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # Slow path only for the chunk that failed: find each bad line exactly.
    parts = []
    for offset, line in enumerate(data.split(b"\n")):
        try:
            parts.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            bad = line[exc.start]
            errors.add(path, first_line + offset,
                       f"not valid UTF-8 at byte {exc.start + 1} of the line (0x{bad:02x})")
            parts.append(line.decode("utf-8", errors="replace"))
    return "\n".join(parts)


def iter_lines(chunks: Iterable[tuple[int, str]]) -> Iterator[str]:
    """Physical lines, each with its "\\n"; split on "\\n" only (str.splitlines would
    also split on \\r, \\x0b, U+2028 ... and shift every line number after them).
    chain + StringIO keep the per-line work in C: this feeds csv.reader's hot loop."""
    return itertools.chain.from_iterable(io.StringIO(text, newline="\n") for _, text in chunks)


def truncate(value: object) -> object:
    if isinstance(value, str) and len(value) > PREVIEW_TEXT_CHARS:
        return value[:PREVIEW_TEXT_CHARS] + "…"
    return value


def finite_or_none(value: float | int | None) -> float | int | None:
    # Schemas are stored as JSON; NaN and Infinity are not JSON and Postgres refuses them.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def infer_label_column(columns: Sequence[str]) -> str | None:
    by_lower = {name.lower(): name for name in reversed(columns)}
    for candidate in LABEL_NAMES:
        if candidate in by_lower:
            return by_lower[candidate]
    return None


def describe_column_difference(expected: Sequence[str], found: Sequence[str], reference: str) -> str:
    missing = [name for name in expected if name not in found]
    extra = [name for name in found if name not in expected]
    parts = []
    if missing:
        parts.append("missing " + ", ".join(repr(name) for name in missing))
    if extra:
        parts.append("unexpected " + ", ".join(repr(name) for name in extra))
    if not parts:
        return f"columns are in a different order than in {reference}"
    return f"columns differ from {reference}: " + "; ".join(parts)


def missing_column_message(role: str, name: str, columns: Sequence[str]) -> str:
    listed = ", ".join(columns) if columns else "(none)"
    return f"{role} column {name!r} not found; the columns are: {listed}"


_KIND_OF_TYPE = {bool: "boolean", int: "integer", float: "float", str: "string",
                 list: "array", dict: "object"}
_SCALAR_KINDS = frozenset({"boolean", "integer", "float", "string"})


def merge_kinds(current: str | None, new: str, mixed: str) -> str:
    if current is None or current == new:
        return new
    if {current, new} == {"integer", "float"}:
        return "float"
    return mixed


@dataclass
class ColumnStats:
    """Type and summary of one column, fed in batches so the per-cell work runs in C
    (map(int, ...), min, set.update) instead of a Python loop per cell."""

    name: str
    kind: str | None = None  # None until a non-null value is seen
    nulls: int = 0
    numbers: int = 0
    minimum: float | int | None = None
    maximum: float | int | None = None
    total: float | int = 0
    distinct: set | None = field(default_factory=set)  # None once past DISTINCT_CAP

    def add_strings(self, values: Sequence[str]) -> None:
        """CSV cells: empty means null; the type is the narrowest that parses them all."""
        empty = values.count("")
        if empty:
            self.nulls += empty
            if empty == len(values):
                return
            present: Sequence[str] = list(filter(None, values))
        else:
            present = values  # the common case: no copy
        self._count_distinct(present)
        kind = self.kind
        if kind == "string":
            return  # Once a column is text, never parse it again: the hot path stays cheap.
        if kind is None or kind == "integer":
            try:
                self._add_numbers(list(map(int, present)), "integer")
                return
            except ValueError:
                pass
        if kind is None or kind == "integer" or kind == "float":
            try:
                self._add_numbers(list(map(float, present)), "float")
                return
            except ValueError:
                pass
        # Lower-case the few distinct spellings, not every cell.
        if (kind is None or kind == "boolean") and {word.lower() for word in set(present)} <= BOOLEAN_WORDS:
            self.kind = "boolean"
            return
        self._become("string")

    def add_values(self, values: Sequence[object]) -> None:
        """JSON values: None (or a missing key) is null; mixed types make "mixed"."""
        present = [value for value in values if value is not None]
        self.nulls += len(values) - len(present)
        if not present:
            return
        kinds = {_KIND_OF_TYPE.get(type(value), "string") for value in present}
        batch_kind: str | None = None
        for kind in kinds:
            batch_kind = merge_kinds(batch_kind, kind, "mixed")
        assert batch_kind is not None
        merged = merge_kinds(self.kind, batch_kind, "mixed")
        if kinds <= _SCALAR_KINDS:
            self._count_distinct(present)
        if merged in ("integer", "float"):
            self._add_numbers(present, merged)  # type: ignore[arg-type]
        else:
            self._become(merged)

    def _count_distinct(self, present: Sequence) -> None:
        if self.distinct is not None:
            self.distinct.update(present)
            if len(self.distinct) > DISTINCT_CAP:
                self.distinct = None

    def _add_numbers(self, numbers: Sequence[int] | Sequence[float], kind: str) -> None:
        self.kind = kind
        low, high = min(numbers), max(numbers)
        self.minimum = low if self.minimum is None or low < self.minimum else self.minimum
        self.maximum = high if self.maximum is None or high > self.maximum else self.maximum
        try:
            self.total += sum(numbers)
        except OverflowError:  # a 400-digit integer met a float: no finite mean exists
            self.total = math.inf
        self.numbers += len(numbers)

    def _become(self, kind: str) -> None:
        self.kind = kind
        self.minimum = self.maximum = None
        self.total = self.numbers = 0

    def as_dict(self) -> dict:
        described: dict = {"name": self.name, "type": self.kind or "string", "nulls": self.nulls}
        if self.kind in ("integer", "float") and self.numbers:
            described["min"] = finite_or_none(self.minimum)
            described["max"] = finite_or_none(self.maximum)
            try:
                described["mean"] = finite_or_none(self.total / self.numbers)
            except OverflowError:  # int / int beyond float range
                described["mean"] = None
        if self.distinct is None:
            described["distinct"] = DISTINCT_CAP
            described["distinct_capped"] = True
        else:
            described["distinct"] = len(self.distinct)
            described["distinct_capped"] = False
        return described


class LabelCounts:
    """Rows per label value, given up (marked high cardinality) past CLASSES_CAP values:
    a regression target has no classes worth listing."""

    def __init__(self) -> None:
        self.counts: Counter | None = Counter()

    def add(self, values: Iterable[object]) -> None:
        if self.counts is None:
            return
        self.counts.update(values)
        if len(self.counts) > CLASSES_CAP:
            self.counts = None

    def schema_part(self) -> dict:
        if self.counts is None:
            return {"classes": {}, "label_cardinality": "high"}
        return {"classes": {_label_key(value): count for value, count in
                            sorted(self.counts.items(), key=lambda item: (-item[1], str(item[0])))}}


def _label_key(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class ScanOptions:
    errors: ErrorLog
    label_column: str = ""
    text_column: str = ""
    delimiter: str = ""


class Scanner(Protocol):
    """One format's reader. scan() is called once per file in a fixed order and returns
    that file's record count; finish() returns (schema, preview) for all files."""

    def scan(self, path: str, source: ByteSource, record_channel: Callable[[int], str]) -> int: ...

    def finish(self) -> tuple[dict, list[dict]]: ...
