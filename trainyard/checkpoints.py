"""Checkpoint files in a job's checkpoint folder: `checkpoint-<step>.pt`, written
atomically, newest N kept.

The node agent syncs this folder to the checkpoint URI while the job runs and restores it
before a resumed attempt, so two rules matter: a file under its final name is always
complete (written under a dot-name, fsynced, then renamed), and the in-progress dot-names
are not checkpoints (agents skip hidden files when syncing; readers ignore them).
torch is imported inside the functions so `import trainyard` stays cheap.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainyard.errors import DataError

KEEP_NEWEST = 2
_NAME = re.compile(r"^checkpoint-(\d+)\.pt$")


def checkpoint_name(step: int) -> str:
    # Zero-padded so a plain sorted listing is also in step order.
    return f"checkpoint-{step:09d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; [] if the folder is missing."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(directory: str | os.PathLike[str]) -> tuple[int, Path] | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def readable_checkpoints(directory: str | os.PathLike[str], algorithm: str) -> Iterator[tuple[int, Path, dict[str, Any]]]:
    """(step, path, state) of each checkpoint that loads, newest first: an unreadable one
    (a sync cut short) is skipped with a warning for the one before it; one written by
    another algorithm is a DataError (the location is someone else's)."""
    for step, path in reversed(list_checkpoints(directory)):
        try:
            state = load_checkpoint(path)
        except Exception as exc:
            sys.stderr.write(f"warning: checkpoint {path.name} is unreadable ({exc}); trying an older one\n")
            sys.stderr.flush()
            continue
        if state.get("algorithm") != algorithm:
            raise DataError(f"checkpoint {path.name} was written by {state.get('algorithm')!r}, not {algorithm}: "
                            "use an empty checkpoint location for a different algorithm")
        yield step, path, state


def save_checkpoint(state: dict[str, Any], step: int, directory: str | os.PathLike[str], *,
                    keep: int = KEEP_NEWEST) -> Path:
    """1. torch.save to a hidden temporary name in the same folder (same file system, so
    the rename is atomic) and fsync it. 2. Rename it to its final name and fsync the
    folder, so a crash leaves either the old set or the new file, never half a file.
    3. Delete all but the newest `keep` checkpoints."""
    import torch

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(step)
    temporary = folder / f".{final.name}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as out:
            torch.save(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    fsync_directory(folder)
    for _, old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return final


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """The saved state. weights_only: a checkpoint folder can be restored from an object
    store, so loading must not run arbitrary pickled code."""
    import torch

    return torch.load(Path(path), map_location=map_location, weights_only=True)


def fsync_directory(folder: Path) -> None:
    """Makes a rename into `folder` itself durable; not possible on every platform, and not fatal."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
