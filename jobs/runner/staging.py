"""Stage a job's input channels into its job directory.

Which records a channel gets (the rule; README "Channels"):
  - A job channel named train / validation / test (or an alias: val, valid) bound to a
    version that has records for that channel gets exactly those: the version's files
    of that channel (a top folder naming the channel is dropped: train/cat/1.png →
    cat/1.png) plus, for a version with a seeded `split`, the records of its unassigned
    files that the split sends to that channel (`trainyard.records`: records numbered
    exactly as validation numbered them).
  - Any other channel (a custom name, or a version without that channel) gets the whole
    version, every file under its own path.

`file` mode copies each file once into a per-node cache keyed by the version's content
hash, verified by SHA-256 (downloaded again on a mismatch) and hard-linked (or copied,
across file systems) into `input/data/<channel>/`; later jobs reuse the cache. Records
split out of a file are cached the same way, per split. `stream` mode copies nothing: the
channel folder holds `manifest.json` with the files' URIs (trainyard.data reads it).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from datasets.storage import CHUNK, StorageError, store_for
from trainyard.records import (
    CHANNEL_ALIASES,
    CHANNELS,
    assign_channel,
    channel_selector,
    csv_delimiter,
    iter_records,
    open_text,
    strip_channel_folder,
)

MANIFEST = "manifest.json"


class StagingError(Exception):
    """A channel could not be staged; the message is the job's failure reason."""


@dataclass(frozen=True)
class VersionFacts:
    """The parts of a DatasetVersion staging needs (plain data: tests build them by hand)."""

    id: int
    label: str  # "iris v3", for messages
    content_hash: str
    format: str
    files: list[dict]  # {"path", "uri", "size", "sha256", "channel", "records"}
    split: dict = field(default_factory=dict)
    delimiter: str = ""
    label_column: str = ""
    text_column: str = ""

    @classmethod
    def of(cls, version) -> VersionFacts:
        return cls(id=version.pk, label=f"{version.dataset.name} v{version.version}", content_hash=version.content_hash,
                   format=version.format, files=list(version.files), split=dict(version.split or {}),
                   delimiter=version.delimiter, label_column=version.label_column, text_column=version.text_column)

    @property
    def cache_key(self) -> str:
        return self.content_hash or f"version-{self.id}"


@dataclass(frozen=True)
class ChannelPlan:
    channel: str | None  # train / validation / test, or None: the whole version
    whole: list[tuple[dict, str]]  # (file, path inside the channel folder)
    split_files: list[dict]  # files whose records the split distributes, in path order


@dataclass
class StagedChannel:
    channel: str
    mode: str
    files: int = 0
    bytes: int = 0
    cached: int = 0  # files served from the cache without a download


def plan_channel(channel: str, version: VersionFacts) -> ChannelPlan:
    wanted = CHANNEL_ALIASES.get(channel.lower())
    named = sorted((f for f in version.files if f.get("channel")), key=lambda f: f["path"])
    unassigned = sorted((f for f in version.files if not f.get("channel")), key=lambda f: f["path"])
    available = {f["channel"] for f in named}
    if version.split and unassigned:
        available |= {name for name in CHANNELS if float(version.split.get(name, 0) or 0) > 0}
    if wanted is None or wanted not in available:
        return ChannelPlan(None, [(f, f["path"]) for f in sorted(version.files, key=lambda f: f["path"])], [])
    whole = [(f, strip_channel_folder(f["path"])) for f in named if f["channel"] == wanted]
    return ChannelPlan(wanted, whole, unassigned if version.split else [])


def _safe_relative(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise StagingError(f"dataset file path {path!r} is not a relative path inside the version")
    return str(pure)


# --- the cache --------------------------------------------------------------------------------
class DataCache:
    """Verified copies of dataset files: <root>/<content hash>/files/<path>, each beside a
    hidden `.<name>.ok` recording (size, mtime, sha256) once it was verified, so a reuse
    costs a stat, not a re-hash. Files are made read-only: they are hard-linked into job
    directories, and a script appending to its input must not change the next job's."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def raw_path(self, version: VersionFacts, file: dict) -> Path:
        return self.root / version.cache_key / "files" / _safe_relative(file["path"])

    def split_path(self, version: VersionFacts, channel: str, file: dict) -> Path:
        split_id = hashlib.sha256(json.dumps(version.split, sort_keys=True).encode()).hexdigest()[:12]
        return self.root / version.cache_key / f"split-{split_id}" / channel / _safe_relative(file["path"])

    def get(self, version: VersionFacts, file: dict) -> tuple[Path, bool]:
        """(the cached file, True if it was already there). Downloads and verifies it
        otherwise; a second mismatch is the object store's problem, reported as such."""
        path = self.raw_path(version, file)
        expected = file.get("sha256") or ""
        if _verified(path, expected, int(file.get("size", -1))):
            return path, True
        for _ in range(2):
            digest, size = _download(file["uri"], path)
            if (not expected or digest == expected) and size == int(file.get("size", size)):
                _mark_verified(path, digest)
                return path, False
        raise StagingError(f"{version.label}: {file['path']} in the object store no longer matches the version "
                           f"(sha256 {digest[:12]}…, {size} bytes; expected {expected[:12]}…, {file.get('size')} bytes); "
                           "register a new version of the dataset")

    def materialised(self, path: Path, source_sha: str) -> dict | None:
        """The record of a split part made from the raw file with `source_sha`, if it is
        still intact: {"records": records in the whole file, "selected": records kept}."""
        if not _verified(path, "", -1, source=source_sha):
            return None
        return json.loads(_sidecar(path).read_text())

    def mark_materialised(self, path: Path, source_sha: str, *, records: int, selected: int) -> None:
        _mark_verified(path, _sha256_file(path), source=source_sha, extra={"records": records, "selected": selected})


def _sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}.ok")


def _verified(path: Path, sha256: str, size: int, *, source: str = "") -> bool:
    try:
        stat = path.stat()
        record = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return False
    if record.get("size") != stat.st_size or record.get("mtime_ns") != stat.st_mtime_ns:
        return False  # touched since it was verified: verify (or fetch) again
    if size >= 0 and stat.st_size != size:
        return False
    if sha256 and record.get("sha256") != sha256:
        return False
    return not source or record.get("source") == source


def _mark_verified(path: Path, sha256: str, *, source: str = "", extra: dict | None = None) -> None:
    with contextlib.suppress(OSError):
        path.chmod(0o444)
    stat = path.stat()
    record = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256, "source": source, **(extra or {})}
    _atomic_write(_sidecar(path), json.dumps(record).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.part-")
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[IO[bytes]]:
    """Write beside the target and rename: two nodes of one machine staging the same file
    at once each finish a whole file, and a reader never sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.part-")
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _download(uri: str, path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    try:
        with contextlib.closing(store_for(uri).open_read(uri)) as source, _writing(path) as out:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except StorageError as exc:
        raise StagingError(f"could not download {uri}: {exc}") from exc
    return digest.hexdigest(), size


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed: a copy does the same job
        shutil.copyfile(source, target)


# --- staging ----------------------------------------------------------------------------------
def stage_channel(channel: str, mode: str, version: VersionFacts, target: Path, cache: DataCache) -> StagedChannel:
    target.mkdir(parents=True, exist_ok=True)
    plan = plan_channel(channel, version)
    staged = StagedChannel(channel=channel, mode=mode)
    if mode == "stream":
        _write_manifest(plan, version, target)
        staged.files = len(plan.whole) + len(plan.split_files)
        staged.bytes = sum(int(f.get("size", 0)) for f, _ in plan.whole) + sum(int(f.get("size", 0)) for f in plan.split_files)
        return staged
    for file, relative in plan.whole:
        cached, hit = cache.get(version, file)
        _link(cached, target / _safe_relative(relative))
        staged.files += 1
        staged.bytes += cached.stat().st_size
        staged.cached += hit
    if plan.split_files:
        assert plan.channel is not None
        _stage_split(plan.channel, plan.split_files, version, target, cache, staged)
    return staged


def _write_manifest(plan: ChannelPlan, version: VersionFacts, target: Path) -> None:
    entries = [{"path": relative, "uri": f["uri"], "size": f.get("size"), "sha256": f.get("sha256", ""), "split": False}
               for f, relative in plan.whole]
    first_index = 0
    for f in plan.split_files:
        entries.append({"path": f["path"], "uri": f["uri"], "size": f.get("size"), "sha256": f.get("sha256", ""),
                        "split": True, "first_index": first_index})
        first_index += int(f.get("records") or 0)
    manifest = {
        "dataset_version": version.id, "label": version.label, "format": version.format,
        "delimiter": version.delimiter, "label_column": version.label_column, "text_column": version.text_column,
        # Records of files marked "split" belong to this channel when
        # trainyard.records.assign_channel(first_index + record index, split) == channel.
        "channel": plan.channel, "split": version.split if plan.split_files else None, "files": entries,
    }
    _atomic_write(target / MANIFEST, json.dumps(manifest, indent=1).encode())


# --- seeded splits ----------------------------------------------------------------------------
def _stage_split(channel: str, files: list[dict], version: VersionFacts, target: Path, cache: DataCache,
                 staged: StagedChannel) -> None:
    """Records are numbered from 0 across the unassigned files in path order, as
    validation numbered them; each file's part is cached per (split, channel)."""
    first_index = 0
    for file in files:
        if version.format == "image_folder":
            # One record per image: only the images of this channel are fetched at all.
            if assign_channel(first_index, version.split) == channel:
                raw, hit = cache.get(version, file)
                _link(raw, target / _safe_relative(file["path"]))
                staged.files += 1
                staged.bytes += raw.stat().st_size
                staged.cached += hit
            first_index += 1
            continue
        raw, hit = cache.get(version, file)
        part = cache.split_path(version, channel, file)
        source_sha = file.get("sha256") or _sha256_file(raw)
        record = cache.materialised(part, source_sha)
        if record is None:
            records, selected = materialise_split(raw, part, version, channel, first_index)
            cache.mark_materialised(part, source_sha, records=records, selected=selected)
        else:
            records, selected = int(record["records"]), int(record["selected"])
        first_index += records
        staged.cached += hit
        if selected:  # a file with none of this channel's records is left out, not left empty
            _link(part, target / _safe_relative(file["path"]))
            staged.files += 1
            staged.bytes += part.stat().st_size


def materialise_split(raw: Path, target: Path, version: VersionFacts, channel: str, first_index: int) -> tuple[int, int]:
    """Write the records of `raw` that the split sends to `channel` into `target` (a CSV
    file's header first), each verbatim, numbered by `trainyard.records` as validation
    numbered them. Returns (records in the file, records written)."""
    keep = channel_selector(version.split, channel, first_index)
    records = selected = 0
    delimiter = csv_delimiter(raw.name, version.delimiter)
    with open(raw, "rb") as binary, _writing(target) as out:
        writer = io.TextIOWrapper(out, encoding="utf-8", newline="")
        for number, record in iter_records(open_text(binary), version.format, delimiter):
            if number is None:
                writer.write(record)
                continue
            if keep(number):
                writer.write(record)
                selected += 1
            records = number + 1
        writer.flush()
        writer.detach()
    return records, selected
