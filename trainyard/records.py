"""The record contract: which channel a dataset file belongs to, what a record of each
format is, and which channel a seeded split sends each record to.

Dataset validation counts records by these rules, the node agent stages a channel's
records by them and a job's `trainyard.data.iter_lines` reads them by them, so all three
see the same records in the same order without storing the split anywhere:

  - A file's channel is named by its top folder or its name (train/…, val.jsonl,
    test.csv); an image's file name never names a channel.
  - CSV / TSV: the first non-blank row is the header; every later non-blank row is one
    record (a quoted field may span lines). The delimiter is the version's, else a tab
    for .tsv files and a comma otherwise.
  - JSON Lines: every line that is not empty or only whitespace is one record.
  - Text: every line that is not empty (a CRLF is read as LF) is one record.
  - Image folder: every image is one record.
  - Records of the files that have no channel of their own are numbered from 0 across
    those files in path order; a record's channel under a seeded split depends only on
    (seed, record number), never on its content.

Text is decoded as UTF-8 (a BOM dropped) and split on "\\n" only, never on \\r or the
other characters str.splitlines would split on. Standard library only: job processes
import this module too.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import IO, BinaryIO

CHANNELS = ("train", "validation", "test")
CHANNEL_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "test": "test",
}
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
DEFAULT_SEED = 0
_TOLERANCE = 1e-6
_TWO_TO_64 = float(2**64)


# --- files and channels -----------------------------------------------------------------------
def channel_of_path(path: str) -> str:
    """The channel a file's name or top folder names: train.csv, val.jsonl, test/cat/1.png."""
    parts = path.split("/")
    if len(parts) > 1 and parts[0].lower() in CHANNEL_ALIASES:
        return CHANNEL_ALIASES[parts[0].lower()]
    # An image called test.png is a picture of a test, not the test channel.
    if path.lower().endswith(IMAGE_EXTENSIONS):
        return ""
    stem = parts[-1].split(".", 1)[0].lower()
    return CHANNEL_ALIASES.get(stem, "")


def strip_channel_folder(path: str) -> str:
    """The path inside its channel: train/cat/1.png → cat/1.png; other paths unchanged."""
    parts = path.split("/")
    if len(parts) > 1 and parts[0].lower() in CHANNEL_ALIASES:
        return "/".join(parts[1:])
    return path


def csv_delimiter(path: str, delimiter: str = "") -> str:
    """The delimiter a CSV file is read with: the version's, else by the file's extension."""
    if delimiter:
        return delimiter
    return "\t" if path.lower().endswith(".tsv") else ","


# --- records ----------------------------------------------------------------------------------
def is_jsonl_record(line: str) -> bool:
    """Whether a JSON Lines line (without its "\\n") is a record."""
    return bool(line) and not line.isspace()


def json_objects(text: IO[str], name: str) -> Iterator[dict]:
    """The objects of a JSON Lines file, in order (blank lines skipped); ValueError naming
    the file and line when one is not valid JSON or not an object."""
    import json

    for line_number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"{name} line {line_number} is not valid JSON") from None
        if not isinstance(row, dict):
            raise ValueError(f"{name} line {line_number} is not a JSON object")
        yield row


def text_lines(chunk: str) -> tuple[str, list[str]]:
    """(the chunk with CRLF read as LF, its lines without newlines) for a chunk of whole
    text lines; the piece after a final newline is not a line. Non-empty lines are records."""
    if "\r" in chunk:
        chunk = chunk.replace("\r\n", "\n")
    lines = chunk.split("\n")
    if chunk.endswith("\n"):
        lines.pop()
    return chunk, lines


def open_text(binary: BinaryIO | IO[bytes]) -> io.TextIOWrapper:
    """A file's text as the record readers see it: UTF-8 without a BOM, lines split on
    "\\n" only (undecodable bytes become replacement characters; validation reports them)."""
    return io.TextIOWrapper(binary, encoding="utf-8-sig", errors="replace", newline="\n")  # type: ignore[arg-type]


def iter_records(text: IO[str], format: str, delimiter: str = ",") -> Iterator[tuple[int | None, str]]:
    """(record number within the file, the record's text ending in "\\n") for each record of
    a CSV, JSON Lines or text file, in order. A CSV file's header comes first, numbered None;
    a record's text is its lines verbatim (a CSV row's lines, quoted newlines included)."""
    if format == "csv":
        yield from _csv_records(text, delimiter)
        return
    number = 0
    for line in text:
        if format == "text":
            is_record = bool(line.removesuffix("\n").removesuffix("\r") if line.endswith("\n") else line)
        else:
            is_record = is_jsonl_record(line.removesuffix("\n"))
        if is_record:
            yield number, line if line.endswith("\n") else line + "\n"
            number += 1


def _csv_records(text: IO[str], delimiter: str) -> Iterator[tuple[int | None, str]]:
    """csv.reader pulls physical lines one at a time, so the lines it consumed for a row
    are exactly that row's text."""
    consumed: list[str] = []

    def lines() -> Iterator[str]:
        for line in text:
            consumed.append(line)
            yield line

    number: int | None = None
    for row in csv.reader(lines(), delimiter=delimiter):
        record = "".join(consumed)
        consumed.clear()
        if not row:
            continue  # a blank line: not a record
        yield number, record if record.endswith("\n") else record + "\n"
        number = 0 if number is None else number + 1


# --- seeded splits ----------------------------------------------------------------------------
def parse_split(raw: Mapping[str, object]) -> dict:
    """Check a split such as {"train": 0.8, "validation": 0.1, "test": 0.1, "seed": 42}.

    Returns {"train", "validation", "test" (floats, missing ones 0.0), "seed" (int)}.
    Raises ValueError with one clear message for the first problem found.
    """
    if not isinstance(raw, Mapping):
        raise ValueError("split must be an object like {\"train\": 0.8, \"validation\": 0.2, \"seed\": 42}")
    unknown = sorted(str(key) for key in raw if key not in CHANNELS and key != "seed")
    if unknown:
        raise ValueError(
            f"split has unknown keys {', '.join(unknown)}; use {', '.join(CHANNELS)} and seed"
        )
    parsed: dict = {}
    for channel in CHANNELS:
        ratio = raw.get(channel, 0.0)
        # bool is an int subclass; "true" as a ratio is a mistake, not 1.0.
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise ValueError(f"split {channel} must be a number between 0 and 1, got {ratio!r}")
        if not math.isfinite(ratio) or ratio < 0 or ratio > 1:
            raise ValueError(f"split {channel} must be between 0 and 1, got {ratio!r}")
        parsed[channel] = float(ratio)
    total = sum(parsed[channel] for channel in CHANNELS)
    if abs(total - 1.0) > _TOLERANCE:
        raise ValueError(f"split ratios must add up to 1, they add up to {total:g}")
    seed = raw.get("seed", DEFAULT_SEED)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"split seed must be an integer, got {seed!r}")
    parsed["seed"] = seed
    return parsed


def unit_interval(seed: int, record_index: int) -> float:
    """A uniform number in [0, 1) from (seed, index) alone; the same on every machine."""
    digest = hashlib.blake2b(f"{seed}:{record_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _TWO_TO_64


def _thresholds(split: Mapping) -> list[tuple[float, str]]:
    cumulative = 0.0
    bounds = []
    for channel in CHANNELS:
        ratio = split.get(channel, 0.0)
        if ratio > 0:
            cumulative += ratio
            bounds.append((cumulative, channel))
    # Ratios that sum to 0.9999999 must not leave a sliver of records unassigned or
    # hand them to a channel whose ratio is zero: the last non-empty channel takes it.
    bounds[-1] = (math.inf, bounds[-1][1])
    return bounds


def assign_channel(record_index: int, split: Mapping) -> str:
    """The channel of record `record_index` under a split returned by parse_split."""
    point = unit_interval(split["seed"], record_index)
    for bound, channel in _thresholds(split):
        if point < bound:
            return channel
    raise AssertionError("unreachable: the last threshold is infinite")


def count_channels(first_index: int, count: int, split: Mapping) -> Counter:
    """How many of records first_index .. first_index+count-1 land in each channel."""
    seed = split["seed"]
    bounds = _thresholds(split)
    counts: Counter = Counter()
    for record_index in range(first_index, first_index + count):
        point = unit_interval(seed, record_index)
        for bound, channel in bounds:
            if point < bound:
                counts[channel] += 1
                break
    return counts


def channel_selector(split: Mapping, channel: str, first_index: int) -> Callable[[int], bool]:
    """Whether record `number` of a file whose first record is `first_index` across the
    split files belongs to `channel`."""
    return lambda number: assign_channel(first_index + number, split) == channel
