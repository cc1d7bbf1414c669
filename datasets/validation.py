"""Validate a dataset version's files in one streaming pass: format checks, schema and
statistics, a preview, per-channel record counts and the content hash.

Pure Python on purpose (no models, no database): the upload page, the API, the
background task and the benchmark all call validate_files with an `open_read` of their
own, and tests feed it files from a temporary folder.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from datasets.formats import EXTENSION_FORMATS, FORMATS, ScanOptions, make_scanner
from datasets.formats.common import ByteSource, ErrorLog, Scanner
from datasets.formats.imagefolder import class_of
from datasets.hashing import combine_content_hash
from trainyard.records import CHANNELS, IMAGE_EXTENSIONS, assign_channel, channel_of_path, count_channels, parse_split

PROGRESS_EVERY_SECONDS = 0.25


@dataclass
class DataFile:
    path: str  # relative path inside the version, '/'-separated, e.g. "train/cat/001.png"
    uri: str  # opaque; handed to open_read
    size: int
    channel: str = ""  # "train" | "validation" | "test" | "" (see assign_file_channels)


@dataclass
class ValidationReport:
    ok: bool
    format: str  # "csv" | "jsonl" | "image_folder" | "text" | "" when unknown
    errors: list[dict]  # {"file", "line" (1-based or None), "message"}; at most 100 + a "more" line
    num_records: int
    schema: dict
    preview: list[dict]
    content_hash: str
    channel_counts: dict
    files: list[dict] = field(default_factory=list)  # {"path","size","sha256","channel","records"}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def infer_format(paths: list[str]) -> str | None:
    """The one format every path's extension points to, or None if mixed or unknown.
    Images count as an image folder only when at least one sits in a class folder."""
    formats = {EXTENSION_FORMATS.get(_extension(path)) for path in paths}
    if len(formats) != 1 or None in formats:
        return None
    (format,) = formats
    if format == "image_folder" and all(class_of(path) is None for path in paths):
        return None
    return format


def assign_file_channels(files: list[DataFile]) -> list[DataFile]:
    """Fill in the channel of every file that has none; returns the same list."""
    for data_file in files:
        if not data_file.channel:
            data_file.channel = channel_of_path(data_file.path)
    return files


class _ProgressMeter:
    def __init__(self, total_bytes: int, callback: Callable[[float], None] | None) -> None:
        self.total = max(total_bytes, 1)
        self.done = 0
        self.callback = callback
        self.last_report = 0.0

    def start(self) -> None:
        if self.callback:
            self.callback(0.0)
            self.last_report = time.monotonic()

    def advance(self, byte_count: int) -> None:
        self.done += byte_count
        if self.callback:
            now = time.monotonic()
            # Throttled: the callback usually writes to the database or a cache.
            if now - self.last_report >= PROGRESS_EVERY_SECONDS:
                self.last_report = now
                self.callback(min(self.done / self.total, 1.0))

    def finish(self) -> None:
        if self.callback:
            self.callback(1.0)


# Failures of the store rather than of the data or of our code. Matched by class name so
# this module imports neither datasets.storage (and with it Django) nor botocore.
_STORAGE_ERROR_NAMES = frozenset({"StorageError", "BotoCoreError", "ClientError"})


def _is_storage_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or any(cls.__name__ in _STORAGE_ERROR_NAMES for cls in type(exc).__mro__)


def _failed_report(format: str, errors: ErrorLog) -> ValidationReport:
    return ValidationReport(ok=False, format=format, errors=errors.as_list(), num_records=0,
                            schema={"columns": [], "label_column": None, "classes": {}},
                            preview=[], content_hash="", channel_counts={}, files=[])


def _explain_unknown_format(paths: list[str]) -> str:
    extensions = sorted({_extension(path) or "(none)" for path in paths})
    if all(path.lower().endswith(IMAGE_EXTENSIONS) for path in paths):
        return ("no class subfolders: an image folder needs one folder per class, like "
                "cat/001.png and dog/002.png")
    return (f"cannot tell the format from the file extensions ({', '.join(extensions)}); "
            "use one kind of file (.csv/.tsv, .jsonl/.ndjson, .txt, or .png/.jpg in class folders) "
            "or choose the format")


def _file_order(data_file: DataFile) -> tuple[int, str]:
    # Train first, so the first file, which the others are compared with, is train's;
    # files without a channel last, numbered for the split in path order.
    rank = CHANNELS.index(data_file.channel) if data_file.channel in CHANNELS else len(CHANNELS)
    return rank, data_file.path


def validate_files(
    files: list[DataFile],
    *,
    format: str | None,
    open_read: Callable[[str], BinaryIO],
    label_column: str = "",
    text_column: str = "",
    delimiter: str = "",
    split: dict | None = None,
    progress: Callable[[float], None] | None = None,
) -> ValidationReport:
    """1. Settle the format, channels and split (problems become errors, not raises).
    2. Read each file once, in channel-then-path order, hashing while the format's
       scanner checks it. 3. Count records per channel and assemble the report.

    Files without a channel go to the split when one is given (record by record,
    see trainyard.records), else to train.
    """
    errors = ErrorLog()
    if not files:
        errors.add("", None, "no files: upload at least one data file")
        return _failed_report(format or "", errors)
    paths = [data_file.path for data_file in files]
    chosen = format or infer_format(paths)
    if chosen is None:
        errors.add("", None, _explain_unknown_format(paths))
        return _failed_report("", errors)
    if chosen not in FORMATS:
        errors.add("", None, f"unknown format {chosen!r}; choose one of {', '.join(FORMATS)}")
        return _failed_report(chosen, errors)
    parsed_split: dict | None = None
    if split:
        try:
            parsed_split = parse_split(split)
        except ValueError as exc:
            errors.add("", None, str(exc))

    assign_file_channels(files)
    ordered = sorted(files, key=_file_order)
    scanner = make_scanner(chosen, ScanOptions(errors=errors, label_column=label_column,
                                               text_column=text_column, delimiter=delimiter))
    meter = _ProgressMeter(sum(data_file.size for data_file in files), progress)
    meter.start()
    channel_counts: Counter = Counter()
    next_split_index = 0
    file_rows: list[dict] = []
    for data_file in ordered:
        record_channel = _record_channel(data_file.channel, next_split_index, parsed_split)
        records, size, sha256 = _scan_one(data_file, open_read, scanner, record_channel, meter, errors)
        if data_file.channel:
            channel_counts[data_file.channel] += records
        elif parsed_split:
            channel_counts.update(count_channels(next_split_index, records, parsed_split))
            next_split_index += records
        else:
            channel_counts["train"] += records
        file_rows.append({"path": data_file.path, "size": size, "sha256": sha256,
                          "channel": data_file.channel or ("" if parsed_split else "train"),
                          "records": records})
    schema, preview = scanner.finish()
    meter.finish()
    return ValidationReport(
        ok=errors.total == 0,
        format=chosen,
        errors=errors.as_list(),
        num_records=sum(row["records"] for row in file_rows),
        schema=schema,
        preview=preview,
        content_hash=combine_content_hash((row["path"], row["size"], row["sha256"]) for row in file_rows),
        channel_counts={name: channel_counts[name] for name in CHANNELS if channel_counts[name]},
        files=file_rows,
    )


def _record_channel(channel: str, first_index: int, split: dict | None) -> Callable[[int], str]:
    if channel:
        return lambda index: channel
    if split:
        return lambda index: assign_channel(first_index + index, split)
    return lambda index: "train"


def _scan_one(data_file: DataFile, open_read: Callable[[str], BinaryIO], scanner: Scanner,
              record_channel: Callable[[int], str], meter: _ProgressMeter,
              errors: ErrorLog) -> tuple[int, int, str]:
    """Returns (records, bytes read, sha256 hex); a file that could not be read fully
    reports its error and an empty hash rather than the hash of a fragment."""
    records = 0
    source: ByteSource | None = None
    try:
        stream = open_read(data_file.uri)
        try:
            source = ByteSource(stream, meter.advance)
            if source.is_empty():
                errors.add(data_file.path, None, "empty file (0 bytes)")
            else:
                records = scanner.scan(data_file.path, source, record_channel)
                source.drain()
        finally:
            stream.close()
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        errors.add(data_file.path, None, f"could not read the file: {exc}")
        return 0, source.size if source else 0, ""
    if source.size != data_file.size:
        errors.add(data_file.path, None, f"read {source.size} bytes but the file was listed with "
                   f"{data_file.size}; did it change during validation?")
    return records, source.size, source.hexdigest()
