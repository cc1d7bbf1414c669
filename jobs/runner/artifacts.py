"""What moves between a job directory and the object store besides input data: the
script's code (in), checkpoints (in before launch, out every few seconds and at exit),
logs (out every few seconds and at exit) and model.tar.gz / output.tar.gz (out at the end).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tarfile
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from datasets.storage import StorageError, join_uri, store_for
from jobs.runner.staging import StagingError

log = logging.getLogger(__name__)
ENTRY_POINT_GUESSES = ("train.py", "main.py", "entry_point.py")


# --- the script --------------------------------------------------------------------------------
def fetch_script(script_uri: str, entry_point: str, code_dir: Path) -> str:
    """1. Download the .py file, or the .tar.gz source folder and unpack it (files and
    folders only, nothing outside code/). 2. Settle the entry point (given, or the one
    obvious .py file) and check it exists. Returns its path relative to code_dir."""
    name = PurePosixPath(script_uri).name
    code_dir.mkdir(parents=True, exist_ok=True)
    try:
        store = store_for(script_uri)
        if name.endswith(".py"):
            store.get_file(script_uri, code_dir / name)
            entry_point = entry_point or name
        elif name.endswith((".tar.gz", ".tgz")):
            with tempfile.TemporaryDirectory(dir=code_dir.parent) as scratch:
                archive = Path(scratch) / name
                store.get_file(script_uri, archive)
                _unpack(archive, code_dir)
            entry_point = entry_point or _guess_entry_point(code_dir)
        else:
            raise StagingError(f"script {script_uri}: expected a .py file or a .tar.gz source folder")
    except StorageError as exc:
        raise StagingError(f"could not download the script: {exc}") from exc
    if not entry_point:
        raise StagingError("the script archive has no obvious entry point (train.py, main.py or a single top-level "
                           ".py file); name one with script.entry_point")
    target = (code_dir / entry_point).resolve()
    if code_dir.resolve() not in target.parents or not target.is_file():
        raise StagingError(f"entry point {entry_point!r} is not a file in the script's source folder")
    return str(target.relative_to(code_dir.resolve()))


def _unpack(archive: Path, code_dir: Path) -> None:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
            for member in members:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts:
                    raise StagingError(f"the script archive entry {member.name!r} would land outside its folder")
            # Where available (3.11.4+), the "data" filter also refuses odd modes and owners.
            options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(code_dir, members=members, **options)  # type: ignore[arg-type]
    except (tarfile.TarError, OSError) as exc:
        raise StagingError(f"could not unpack the script archive: {exc}") from exc


def _guess_entry_point(code_dir: Path) -> str:
    for preferred in ENTRY_POINT_GUESSES:
        if (code_dir / preferred).is_file():
            return preferred
    top_level = [p.name for p in code_dir.glob("*.py")]
    return top_level[0] if len(top_level) == 1 else ""


# --- checkpoints --------------------------------------------------------------------------------
@dataclass
class SyncResult:
    uploaded: int = 0
    deleted: int = 0


class CheckpointSync:
    """Mirrors the job's checkpoints/ folder to the checkpoint URI.

    Hidden files are skipped: trainyard.checkpoints (and any careful script) writes under
    a dot-name and renames, so a visible name is a complete file. A file that this sync
    knew (restored or uploaded) and that the job deleted (a rotation of old checkpoints) is
    deleted remotely too; anything else in the remote folder is left alone."""

    def __init__(self, local_dir: Path, uri: str) -> None:
        self.local_dir = local_dir
        self.uri = uri.rstrip("/")
        self._known: dict[str, tuple[int, int]] = {}  # relative path → (size, mtime_ns) last synced
        self._lock = threading.Lock()

    def restore(self) -> int:
        """Download every checkpoint file into the empty local folder; returns how many."""
        count = 0
        store = store_for(self.uri)
        try:
            objects = list(store.list(self.uri + "/"))
        except StorageError as exc:
            raise StagingError(f"could not list the checkpoints at {self.uri}: {exc}") from exc
        for info in objects:
            relative = PurePosixPath(info.relative_path)
            if ".." in relative.parts or relative.is_absolute():
                continue
            local = self.local_dir / relative
            try:
                store.get_file(info.uri, local)
            except StorageError as exc:
                raise StagingError(f"could not download checkpoint {info.uri}: {exc}") from exc
            self._known[str(relative)] = _stat_key(local)
            count += 1
        return count

    def sync(self) -> SyncResult:
        with self._lock:
            return self._sync()

    def _sync(self) -> SyncResult:
        result = SyncResult()
        store = store_for(self.uri)
        present: dict[str, tuple[int, int]] = {}
        for path in _visible_files(self.local_dir):
            relative = path.relative_to(self.local_dir).as_posix()
            with contextlib.suppress(FileNotFoundError):
                present[relative] = _stat_key(path)
        for relative, key in present.items():
            if self._known.get(relative) == key:
                continue
            try:
                store.put_file(self.local_dir / relative, join_uri(self.uri, relative))
            except (FileNotFoundError, StorageError) as exc:  # rotated away mid-upload, or store trouble: next time
                log.warning("checkpoint sync of %s failed: %s", relative, exc)
                continue
            self._known[relative] = key
            result.uploaded += 1
        for relative in [name for name in self._known if name not in present]:
            try:
                store.delete_prefix(join_uri(self.uri, relative))
            except StorageError as exc:
                log.warning("could not delete rotated checkpoint %s: %s", relative, exc)
                continue
            del self._known[relative]
            result.deleted += 1
        return result


def _visible_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(Path(dirpath) / name for name in filenames if not name.startswith("."))
    return sorted(found)


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


# --- model and output archives ------------------------------------------------------------------
def upload_archive(folder: Path, uri: str) -> int:
    """tar.gz of the folder's contents (at the archive's top level, as SageMaker's
    model.tar.gz), streamed to the store; returns the number of files. Hidden temporary
    files are included: model/ is the job's to define."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() or p.is_dir())
    with store_for(uri).open_write(uri) as out, tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in files:
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return sum(1 for p in files if p.is_file())


def has_files(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


class FileUploader:
    """Uploads files that changed since their last upload (size or mtime): the log files,
    every few seconds while the job runs and once more at the end."""

    def __init__(self) -> None:
        self._uploaded: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def upload_changed(self, files: dict[Path, str]) -> int:
        count = 0
        with self._lock:
            for path, uri in files.items():
                try:
                    key = _stat_key(path)
                except FileNotFoundError:
                    continue
                if self._uploaded.get(path) == key:
                    continue
                try:
                    store_for(uri).put_file(path, uri)
                except (OSError, StorageError) as exc:
                    log.warning("upload of %s to %s failed (retried at the next sync): %s", path, uri, exc)
                    continue
                self._uploaded[path] = key
                count += 1
        return count
