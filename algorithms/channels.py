"""Reading a built-in algorithm's input channels: the channel folders, the data files in
them, tables from CSV/TSV and JSON Lines (copied or streamed), labels and their vocabulary,
and the seeded hold-out when there is no validation channel.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainyard.data import iter_lines, read_manifest
from trainyard.errors import DataError
from trainyard.parallel.processes import emit

if TYPE_CHECKING:
    from algorithms.process import Context

TABLE_EXTENSIONS = (".csv", ".tsv", ".jsonl", ".ndjson")
LABEL_NAMES = ("label", "target", "class", "y", "category")  # as datasets/formats infers them
HOLDOUT_FRACTION = 0.1


def required_channel(ctx: Context, name: str) -> Path:
    folder = optional_channel(ctx, name)
    if folder is None:
        raise DataError(f"no {name!r} channel: this algorithm needs {name!r} input data")
    return folder


def optional_channel(ctx: Context, name: str) -> Path | None:
    folder = ctx.env.channel(name)
    if folder is not None and not folder.is_dir():
        raise DataError(f"channel {name!r} folder {folder} does not exist")
    return folder


def data_files(folder: Path, extensions: Iterable[str], channel: str) -> list[Path]:
    """Every file under folder with one of the extensions, recursively, in path order;
    hidden files (.DS_Store, partial downloads) are not data."""
    wanted = tuple(extensions)
    found = sorted((path for path in folder.rglob("*") if path.is_file()),
                   key=lambda path: path.relative_to(folder).as_posix())
    visible = [path for path in found if not any(part.startswith(".") for part in path.relative_to(folder).parts)]
    chosen = [path for path in visible if path.name.lower().endswith(wanted)]
    if not chosen:
        present = ", ".join(path.relative_to(folder).as_posix() for path in visible[:5]) or "nothing"
        more = f" and {len(visible) - 5} more" if len(visible) > 5 else ""
        raise DataError(f"no {', '.join(wanted)} files in channel {channel!r}; it holds {present}{more}")
    return chosen


@dataclass
class Table:
    name: str  # the first file's path inside the channel, for messages
    columns: list[str]
    rows: list[dict[str, Any]]


def read_table(folder: Path, channel: str) -> Table:
    """CSV/TSV (header row) and JSON Lines files of one channel as one list of rows."""
    if read_manifest(folder) is not None:
        return _read_streamed_table(folder, channel)
    files = data_files(folder, TABLE_EXTENSIONS, channel)
    name = files[0].relative_to(folder).as_posix()
    columns: list[str] = []
    rows: list[dict[str, Any]] = []
    for path in files:
        relative = path.relative_to(folder).as_posix()
        if path.name.lower().endswith((".csv", ".tsv")):
            header, file_rows = _read_csv(path, relative)
            if columns and set(header) != set(columns):
                raise DataError(f"{relative} has columns {', '.join(header)} but {name} has {', '.join(columns)}")
        else:
            header, file_rows = _read_jsonl(path, relative)
        columns.extend(column for column in header if column not in columns)
        rows.extend(file_rows)
    if not rows:
        raise DataError(f"channel {channel!r} has no records ({name})")
    return Table(name=name if len(files) == 1 else f"{name} (and {len(files) - 1} more files)", columns=columns, rows=rows)


def _read_streamed_table(folder: Path, channel: str) -> Table:
    """A `stream`-mode channel: the records come straight from the object store, through
    the manifest (trainyard.data keeps only this channel's records of a split version)."""
    manifest = read_manifest(folder) or {}
    name = f"{channel} (streamed from dataset version {manifest.get('dataset_version')})"
    text = "".join(iter_lines(folder))
    if manifest.get("format") == "jsonl":
        columns, rows = _parse_jsonl(text, name)
    else:
        columns, rows = _parse_csv(text, name, manifest.get("delimiter") or ",")
    if not rows:
        raise DataError(f"channel {channel!r} has no records ({name})")
    return Table(name=name, columns=columns, rows=rows)


def _read_csv(path: Path, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    delimiter = "\t" if path.name.lower().endswith(".tsv") else ","
    return _parse_csv(_read_text(path, relative), relative, delimiter)


def _parse_csv(text: str, relative: str, delimiter: str) -> tuple[list[str], list[dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    header = next(reader, None)
    if not header:
        raise DataError(f"{relative} is empty: a CSV file needs a header row")
    header = [column.strip() for column in header]
    rows = []
    for values in reader:
        if not values or values == [""]:
            continue
        if len(values) != len(header):
            raise DataError(f"{relative} line {reader.line_num}: {len(values)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, values, strict=True)))
    return header, rows


def _read_jsonl(path: Path, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    return _parse_jsonl(_read_text(path, relative), relative)


def _parse_jsonl(text: str, relative: str) -> tuple[list[str], list[dict[str, Any]]]:
    columns: dict[str, None] = {}
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{relative} line {number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise DataError(f"{relative} line {number}: each line must be a JSON object")
        columns.update(dict.fromkeys(record))
        rows.append(record)
    return list(columns), rows


def _read_text(path: Path, relative: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{relative} is not UTF-8 text (byte {exc.start})") from None


def find_label_column(table: Table, requested: str) -> str:
    if requested:
        if requested not in table.columns:
            raise DataError(f"label column {requested!r} not found in {table.name}; columns are {', '.join(table.columns)}")
        return requested
    by_lower = {column.lower(): column for column in reversed(table.columns)}
    for candidate in LABEL_NAMES:
        if candidate in by_lower:
            return by_lower[candidate]
    raise DataError(f"no label column in {table.name}: set the hyperparameter label_column to one of "
                    f"{', '.join(table.columns)} (none is named {', '.join(LABEL_NAMES)})")


def label_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON 1.0 and CSV "1" are the same class
    return str(value).strip()


def label_vocabulary(labels: Iterable[str], where: str) -> list[str]:
    classes = sorted(set(labels))
    if len(classes) < 2:
        found = f"only {classes[0]!r}" if classes else "no labels"
        raise DataError(f"{where} has {found}: a classifier needs at least two classes")
    return classes


def encode_labels(labels: Sequence[str], classes: list[str], where: str) -> tuple[np.ndarray, np.ndarray]:
    """(class indices, kept row indices): rows whose class train never saw cannot be scored."""
    index = {label: position for position, label in enumerate(classes)}
    kept = [row for row, label in enumerate(labels) if label in index]
    dropped = len(labels) - len(kept)
    if dropped:
        unseen = sorted({label for label in labels if label not in index})[:5]
        emit(f"warning: {where}: skipped {dropped} rows whose label is not in train ({', '.join(map(repr, unseen))})",
             sys.stderr)
    return np.array([index[labels[row]] for row in kept], dtype=np.int64), np.array(kept, dtype=np.int64)


def holdout_split(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, validation indices): a seeded 10% when there is no validation channel."""
    if count < 2:
        raise DataError(f"train has {count} record(s): need at least 2 to hold some out, or a validation channel")
    order = np.random.default_rng(seed).permutation(count)
    held = max(1, int(round(count * HOLDOUT_FRACTION)))
    return np.sort(order[held:]), np.sort(order[:held])
