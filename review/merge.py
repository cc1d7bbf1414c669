"""Merge reviewed records into the training data of the model they came from (docs/SPEC.md §5).

"Retrain with the human labels" means: the records the source job's `train` channel read,
with the reviewed ones added and — where a reviewed record is already among them — its
label replaced by the people's. The result is written as files for the next version of
the training dataset; the other channels of that version (validation, test) are carried
over unchanged, so the new version is a complete dataset.

Which records the source job's `train` channel read follows the staging rule
(jobs.runner.staging.plan_channel): the version's train files, plus the records its seeded
split sends to train (those are written out as `train/<path>`, and the split's other
channels as `<channel>/<path>`, so the new version needs no split); a version without a
train channel is read whole, and its files keep their paths.

Record identity — when is a reviewed record "already in the training data"?
- CSV: the same value in every feature column (all columns but the label), compared by
  value: numbers as numbers ("0.50" is 0.5), other cells as trimmed text. The reviewed
  row must have exactly the training file's feature columns, else nothing is merged.
- JSON Lines: text records (a flow over texts) match on the text column alone; object
  records on every field but the label, compared as values.
- Image folders: the same bytes (SHA-256 of the decoded image against the file's).
Every training record that matches gets the human label; reviewed records that match
none are added. A record reviewed twice counts once, with its latest consensus.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets.models import DatasetVersion
from datasets.storage import store_for
from jobs.runner.staging import VersionFacts, materialise_split, plan_channel
from trainyard.records import CHANNELS, assign_channel

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/jpg": "jpg"}
CHANNEL_FOLDERS = {"train", "validation", "valid", "val", "test"}
RECORD_WORD = {"csv": "rows", "jsonl": "records", "image_folder": "images", "text": "lines"}


class MergeImpossible(Exception):
    """The reviewed records cannot be merged into the training data; the message says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Reviewed:
    """One exportable loop: what the model was asked, and the people's label."""

    name: str
    content: dict
    label: str


@dataclass
class MergeCounts:
    base_records: int = 0  # records the source job's train channel read
    reviewed: int = 0  # reviewed records offered (one per loop)
    added: int = 0  # reviewed records that were not in the training data
    relabelled: int = 0  # training records whose label the review changed
    confirmed: int = 0  # training records the review matched with the same label
    carried: dict[str, int] = field(default_factory=dict)  # other channels, copied unchanged

    @property
    def records(self) -> int:
        return self.base_records + self.added

    def as_dict(self) -> dict:
        return {"base_records": self.base_records, "reviewed": self.reviewed, "added": self.added,
                "relabelled": self.relabelled, "confirmed": self.confirmed, "records": self.records,
                "carried": dict(self.carried)}


@dataclass(frozen=True)
class Columns:
    """The label and text columns the model was trained with."""

    label: str
    text: str


@dataclass
class Merged:
    files: dict[str, Path]  # path in the new version → local file
    counts: MergeCounts
    split: dict | None  # the new version's split: the base's, unless its split records were written out


def version_label(version: DatasetVersion) -> str:
    return f"{version.dataset.name} v{version.version}"


def summary_text(counts: MergeCounts, base_label: str, record_format: str) -> str:
    """"8,000 rows of demo-tabular v1 + 6 reviewed, 2 relabelled"."""
    word = RECORD_WORD.get(record_format, "records")
    return f"{counts.base_records:,} {word} of {base_label} + {counts.reviewed:,} reviewed, {counts.relabelled:,} relabelled"


# --- reading the base version ---------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """A file of the new version: where its records come from and which of them."""

    out_path: str
    file: dict  # the base version's file entry
    channel: str | None  # None: every record of the file; else the split's records of that channel
    first_index: int = 0  # the file's first record number in the split (split parts only)


@dataclass
class Layout:
    train: list[Part]
    carried: list[Part]

    @property
    def splits(self) -> bool:
        """True when split records are written out per channel (the new version has no split)."""
        return any(part.channel is not None for part in (*self.train, *self.carried))


def layout_of(base: DatasetVersion, train_channel: str = "train") -> Layout:
    """Which base files (or split parts of them) are the train channel and which are
    carried over, with their paths in the new version."""
    facts = VersionFacts.of(base)
    plan = plan_channel(train_channel, facts)
    files = sorted(base.files, key=lambda f: f["path"])
    if plan.channel is None:
        return Layout(train=[Part(f["path"], f, None) for f in files], carried=[])
    train: list[Part] = []
    carried: list[Part] = []
    for f in files:
        if f.get("channel"):
            (train if f["channel"] == plan.channel else carried).append(Part(f["path"], f, None))
        elif not plan.split_files:
            carried.append(Part(f["path"], f, None))  # read by no channel of that name: kept as is
    if plan.split_files:
        split_channels = [c for c in CHANNELS if float((base.split or {}).get(c, 0) or 0) > 0]
        for channel in split_channels:
            first_index = 0
            for f in plan.split_files:
                part = Part(f"{channel}/{f['path']}", f, channel, first_index)
                (train if channel == plan.channel else carried).append(part)
                first_index += int(f.get("records") or (1 if base.format == "image_folder" else 0))
    return Layout(train=train, carried=carried)


def fetch(file: dict, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with store_for(file["uri"]).open_read(file["uri"]) as stream, open(target, "wb") as out:
        shutil.copyfileobj(stream, out, 1024 * 1024)
    return target


def local_part(part: Part, base: DatasetVersion, work: Path, index: int) -> Path | None:
    """The part's records as a local file (None: an image the split sends elsewhere)."""
    raw = work / "raw" / str(index) / Path(part.file["path"]).name
    if part.channel is None:
        return fetch(part.file, raw)
    if base.format == "image_folder":
        if assign_channel(part.first_index, _parsed_split(base)) != part.channel:
            return None
        return fetch(part.file, raw)
    fetch(part.file, raw)
    target = work / "split" / str(index) / Path(part.file["path"]).name
    target.parent.mkdir(parents=True, exist_ok=True)
    facts = VersionFacts.of(base)
    facts = VersionFacts(**{**facts.__dict__, "split": _parsed_split(base)})
    _records, selected = materialise_split(raw, target, facts, part.channel, part.first_index)
    return target if selected else None


def _parsed_split(base: DatasetVersion) -> dict:
    from trainyard.records import parse_split

    return parse_split(base.split or {})


# --- value identity -------------------------------------------------------------------------
def cell_key(value: Any) -> str:
    """A cell compared by value: numbers as numbers, booleans as words, text trimmed."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        number = float(value)
        return repr(number) if math.isfinite(number) else str(value)
    text = str(value).strip()
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        return text
    return repr(number) if math.isfinite(number) else text


def value_key(value: Any) -> Any:
    """A JSON value made comparable: numbers by value, objects by sorted keys."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), value_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(value_key(v) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    return str(value)


# --- CSV --------------------------------------------------------------------------------------
def _csv_rows(path: Path, delimiter: str) -> Iterator[tuple[list[str], str]]:
    """(cells, the row's exact text) for every non-blank row, header included."""
    consumed: list[str] = []
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as text:
        def lines() -> Iterator[str]:
            for line in text:
                consumed.append(line)
                yield line

        for row in csv.reader(lines(), delimiter=delimiter):
            chunk = "".join(consumed)
            consumed.clear()
            if row:
                yield row, chunk if chunk.endswith("\n") else chunk + "\n"


def _csv_line(cells: list[str], delimiter: str) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, delimiter=delimiter, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def _reviewed_row(item: Reviewed, columns: Columns) -> dict:
    content = item.content
    if isinstance(content.get("row"), dict):
        return {str(k): v for k, v in content["row"].items() if str(k) != columns.label}
    if isinstance(content.get("text"), str):
        return {columns.text: content["text"]}
    raise MergeImpossible(f"Human loop {item.name} holds neither a table row nor a text; it cannot become a CSV row.")


def _check_columns(features: list[str], row: dict, base_label: str, item: Reviewed) -> None:
    missing = [c for c in features if c not in row]
    extra = [c for c in row if c not in features]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"not in the training data: {', '.join(extra)}")
        raise MergeImpossible(f"The reviewed rows' columns differ from {base_label}'s ({'; '.join(parts)}; "
                              f"human loop {item.name}), so they cannot be merged into it. Export the reviewed "
                              "items alone instead (mode reviewed_only).")


def merge_csv(parts: list[tuple[str, Path]], reviewed: list[Reviewed], base: DatasetVersion, columns: Columns,
              out: Path | None) -> tuple[dict[str, Path], MergeCounts]:
    label_name = version_label(base)
    counts = MergeCounts(reviewed=len(reviewed))
    files: dict[str, Path] = {}
    wanted: dict[tuple, str] = {}
    matched: set[tuple] = set()
    last_header: list[str] = []
    last_out: Path | None = None
    last_delimiter = ","
    for index, (out_path, local) in enumerate(parts):
        delimiter = base.delimiter or ("\t" if out_path.lower().endswith(".tsv") else ",")
        rows = _csv_rows(local, delimiter)
        header, header_text = next(rows, ([], ""))
        if columns.label not in header:
            raise MergeImpossible(f"{label_name} ({out_path}) has no column {columns.label!r}, the label column the "
                                  "model was trained with; the reviewed labels cannot be merged into it.")
        label_at = header.index(columns.label)
        features = sorted(c for c in header if c != columns.label)
        if index == 0:
            for item in reviewed:
                row = _reviewed_row(item, columns)
                _check_columns(features, row, label_name, item)
                wanted[tuple(cell_key(row[c]) for c in features)] = item.label
        target = (out / f"part-{index}.csv") if out is not None else None
        with open(target if target is not None else os.devnull, "w", encoding="utf-8", newline="") as writer:
            writer.write(header_text)
            for cells, text in rows:
                counts.base_records += 1
                record = dict(zip(header, cells, strict=False))
                key = tuple(cell_key(record.get(c)) for c in features)
                human = wanted.get(key)
                if human is not None:
                    matched.add(key)
                    current = cells[label_at] if label_at < len(cells) else ""
                    if current.strip() != human:
                        counts.relabelled += 1
                        cells = [*cells, *[""] * (len(header) - len(cells))]
                        cells[label_at] = human
                        text = _csv_line(cells, delimiter)
                    else:
                        counts.confirmed += 1
                writer.write(text)
        if target is not None:
            files[out_path] = target
        last_header, last_out, last_delimiter = header, target, delimiter
    new = [(key, label) for key, label in wanted.items() if key not in matched]
    counts.added = len(new)
    if new and last_out is not None:
        by_key = {}
        for item in reviewed:
            row = _reviewed_row(item, columns)
            by_key[tuple(cell_key(row[c]) for c in sorted(c for c in last_header if c != columns.label))] = row
        with open(last_out, "a", encoding="utf-8", newline="") as writer:
            for key, label in new:
                row = by_key[key]
                cells = [label if c == columns.label else _cell(row.get(c)) for c in last_header]
                writer.write(_csv_line(cells, last_delimiter))
    return files, counts


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


# --- JSON Lines -------------------------------------------------------------------------------
def _jsonl_key(record: dict, item_kind: str, columns: Columns) -> Any:
    if item_kind == "texts":
        return ("text", record.get(columns.text))
    return value_key({k: v for k, v in record.items() if k != columns.label})


def _reviewed_record(item: Reviewed, columns: Columns) -> tuple[str, dict]:
    content = item.content
    if isinstance(content.get("text"), str) and not isinstance(content.get("row"), dict):
        return "texts", {columns.text: content["text"]}
    if isinstance(content.get("row"), dict):
        return "objects", {str(k): v for k, v in content["row"].items() if str(k) != columns.label}
    return "objects", {k: v for k, v in content.items() if k != columns.label and k != "label"}


def merge_jsonl(parts: list[tuple[str, Path]], reviewed: list[Reviewed], base: DatasetVersion, columns: Columns,
                out: Path | None) -> tuple[dict[str, Path], MergeCounts]:
    label_name = version_label(base)
    counts = MergeCounts(reviewed=len(reviewed))
    kinds = {_reviewed_record(item, columns)[0] for item in reviewed}
    item_kind = "texts" if kinds == {"texts"} else "objects"
    wanted: dict[Any, tuple[str, dict]] = {}
    for item in reviewed:
        _kind, record = _reviewed_record(item, columns)
        wanted[_jsonl_key(record, item_kind, columns)] = (item.label, record)
    matched: set = set()
    files: dict[str, Path] = {}
    checked = False
    last_out: Path | None = None
    for index, (out_path, local) in enumerate(parts):
        target = (out / f"part-{index}.jsonl") if out is not None else None
        with (open(target if target is not None else os.devnull, "w", encoding="utf-8", newline="") as writer,
              open(local, encoding="utf-8-sig", errors="replace", newline="\n") as text):
            for line in text:
                if not line.strip():
                    writer.write(line)
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise MergeImpossible(f"{label_name} ({out_path}) holds JSON values that are not objects; "
                                          "labels cannot be merged into it.")
                if not checked:
                    _check_fields(record, item_kind, columns, reviewed, label_name)
                    checked = True
                counts.base_records += 1
                key = _jsonl_key(record, item_kind, columns)
                if key in wanted:
                    matched.add(key)
                    human = wanted[key][0]
                    if str(record.get(columns.label, "")) != human:
                        counts.relabelled += 1
                        record[columns.label] = human
                        line = json.dumps(record, ensure_ascii=False) + "\n"
                    else:
                        counts.confirmed += 1
                writer.write(line if line.endswith("\n") else line + "\n")
        if target is not None:
            files[out_path] = target
            last_out = target
    new = [(label, record) for key, (label, record) in wanted.items() if key not in matched]
    counts.added = len(new)
    if new and last_out is not None:
        with open(last_out, "a", encoding="utf-8") as writer:
            for label, record in new:
                writer.write(json.dumps({**record, columns.label: label}, ensure_ascii=False) + "\n")
    return files, counts


def _check_fields(record: dict, item_kind: str, columns: Columns, reviewed: list[Reviewed], label_name: str) -> None:
    if columns.label not in record:
        raise MergeImpossible(f"{label_name}'s records have no {columns.label!r} field, the label the model was "
                              "trained with; the reviewed labels cannot be merged into it.")
    if item_kind == "texts":
        if columns.text not in record:
            raise MergeImpossible(f"{label_name}'s records have no {columns.text!r} field to hold the reviewed texts.")
        return
    fields = sorted(k for k in record if k != columns.label)
    for item in reviewed:
        _kind, candidate = _reviewed_record(item, columns)
        if sorted(candidate) != fields:
            raise MergeImpossible(f"The reviewed records' fields ({', '.join(sorted(candidate))}) differ from "
                                  f"{label_name}'s ({', '.join(fields)}), so they cannot be merged into it. Export "
                                  "the reviewed items alone instead (mode reviewed_only).")


# --- image folders ----------------------------------------------------------------------------
def _class_of(path: str) -> tuple[str, str, str]:
    """(channel folder prefix incl. "/", class folder, rest) of an image path."""
    parts = path.split("/")
    prefix = ""
    if len(parts) > 2 and parts[0].lower() in CHANNEL_FOLDERS:
        prefix, parts = parts[0] + "/", parts[1:]
    if len(parts) < 2:
        return prefix, "", "/".join(parts)
    return prefix, parts[0], "/".join(parts[1:])


def _image_bytes(item: Reviewed) -> bytes:
    if not isinstance(item.content.get("image"), str):
        raise MergeImpossible(f"Human loop {item.name} holds no image; it cannot join an image folder.")
    try:
        return base64.b64decode(item.content["image"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MergeImpossible(f"Human loop {item.name}: the image is not valid base64.") from exc


def check_folder_label(label: str) -> None:
    if "/" in label or label in (".", "..", "") or "\x00" in label:
        raise MergeImpossible(f"Label {label!r} cannot name an image folder.")


def merge_images(parts: list[Part], reviewed: list[Reviewed], base: DatasetVersion, work: Path,
                 out: Path | None) -> tuple[dict[str, Path], MergeCounts]:
    """Matched by SHA-256 (the base files' digests are in the version, so nothing is
    downloaded to count); a relabelled image moves to the human label's folder."""
    counts = MergeCounts(reviewed=len(reviewed))
    wanted: dict[str, tuple[str, Reviewed, bytes]] = {}
    for item in reviewed:
        check_folder_label(item.label)
        data = _image_bytes(item)
        wanted[hashlib.sha256(data).hexdigest()] = (item.label, item, data)
    split = _parsed_split(base) if base.split else None
    files: dict[str, Path] = {}
    matched: set[str] = set()
    prefix = ""
    for index, part in enumerate(parts):
        if part.channel is not None and split is not None and assign_channel(part.first_index, split) != part.channel:
            continue
        counts.base_records += 1
        part_prefix, label, rest = _class_of(part.out_path)
        prefix = part_prefix or prefix
        digest = part.file.get("sha256") or part.file.get("fingerprint") or ""
        out_path = part.out_path
        if digest in wanted:
            matched.add(digest)
            human = wanted[digest][0]
            if label != human:
                counts.relabelled += 1
                out_path = f"{part_prefix}{human}/{rest}"
            else:
                counts.confirmed += 1
        if out is not None:
            local = fetch(part.file, work / "images" / f"{index}{Path(part.file['path']).suffix}")
            files[out_path] = local
    new = [value for digest, value in wanted.items() if digest not in matched]
    counts.added = len(new)
    if out is not None:
        for label, item, data in new:
            extension = IMAGE_EXTENSIONS.get(str(item.content.get("media_type", "image/png")).lower(), "png")
            relative = f"{prefix}{label}/reviewed-{SAFE_NAME.sub('_', item.name)}.{extension}"
            local = out / f"new-{len(files)}.{extension}"
            local.write_bytes(data)
            files[relative] = local
    return files, counts


# --- the whole merge --------------------------------------------------------------------------
def merge(base: DatasetVersion, reviewed: list[Reviewed], columns: Columns, work: Path, *,
          write: bool = True, train_channel: str = "train") -> Merged:
    """The files of the next version of `base`'s dataset (write=False: only the counts,
    nothing kept — what the confirm dialog shows)."""
    if base.format == "text":
        raise MergeImpossible(f"{version_label(base)} is plain text without labels; reviewed labels cannot be "
                              "merged into it.")
    if base.format not in ("csv", "jsonl", "image_folder"):
        raise MergeImpossible(f"{version_label(base)} has format {base.format!r}, which labels cannot be merged into.")
    layout = layout_of(base, train_channel)
    if not layout.train:
        raise MergeImpossible(f"{version_label(base)} has no training records to merge into.")
    out = work / "out" if write else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    if base.format == "image_folder":
        files, counts = merge_images(layout.train, reviewed, base, work, out)
    else:
        locals_: list[tuple[str, Path]] = []
        for index, part in enumerate(layout.train):
            local = local_part(part, base, work, index)
            if local is not None:
                locals_.append((part.out_path, local))
        if not locals_:
            raise MergeImpossible(f"{version_label(base)} has no training records to merge into.")
        if base.format == "csv":
            files, counts = merge_csv(locals_, reviewed, base, columns, out)
        else:
            files, counts = merge_jsonl(locals_, reviewed, base, columns, out)
    carried_files, counts.carried = _carry(layout.carried, base, work, write)
    files.update(carried_files)
    return Merged(files=files, counts=counts, split=None if layout.splits else (base.split or None))


def _carry(parts: list[Part], base: DatasetVersion, work: Path, write: bool) -> tuple[dict[str, Path], dict[str, int]]:
    """The other channels' records, unchanged, and how many each channel has (as
    validation counted them)."""
    channels = sorted({part.channel or part.file.get("channel") or "" for part in parts} - {""})
    counts = {channel: int((base.channel_counts or {}).get(channel, 0)) for channel in channels}
    files: dict[str, Path] = {}
    if write:
        for index, part in enumerate(parts, start=len(base.files) + 1):
            local = local_part(part, base, work, index)
            if local is not None:
                files[part.out_path] = local
    return files, counts
