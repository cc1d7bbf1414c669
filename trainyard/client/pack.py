"""Packing a source folder into the .tar.gz that POST /api/v1/scripts/ takes: the files a
`git add` would take (every .gitignore in the folder honoured, with pathspec), never a
virtualenv, `.git` or `__pycache__`, and no file over the size limit — each file left out
for its size or its kind is reported, so nothing goes missing silently."""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
# The studio refuses larger scripts (jobs.scripts.MAX_SCRIPT_BYTES).
MAX_ARCHIVE_BYTES = 200 * 1024 * 1024
NEVER_PACKED_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "__pycache__", ".mypy_cache", ".pytest_cache",
                               ".ruff_cache", ".ipynb_checkpoints"})
NEVER_PACKED_SUFFIXES = (".pyc", ".pyo")


class PackError(Exception):
    pass


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class PackedSource:
    data: bytes
    files: list[str]
    skipped: list[Skipped] = field(default_factory=list)
    total_bytes: int = 0


def human_size(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _ignore_spec(folder: Path) -> pathspec.PathSpec | None:
    gitignore = folder / ".gitignore"
    if not gitignore.is_file():
        return None
    return pathspec.GitIgnoreSpec.from_lines(gitignore.read_text(errors="replace").splitlines())


def _ignored(relative: str, is_dir: bool, specs: list[tuple[str, pathspec.PathSpec]]) -> bool:
    """Whether any .gitignore above `relative` (a path from the source root) leaves it out;
    each file's patterns are matched relative to its own folder, as git does."""
    for base, spec in specs:
        inner = relative[len(base) + 1:] if base else relative
        if spec.match_file(inner + "/" if is_dir else inner):
            return True
    return False


def pack_source(source_dir: Path | str, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> PackedSource:
    """1. Walk the folder, leaving out what .gitignore files, the never-packed folders
    (and any folder holding a pyvenv.cfg: a virtualenv under another name), links that
    point outside it and files over `max_file_bytes` say to. 2. Write the rest, sorted,
    into a gzipped tar whose names are relative to the folder."""
    root = Path(source_dir).resolve()
    if not root.is_dir():
        raise PackError(f"{source_dir} is not a folder")
    files: list[tuple[str, Path]] = []
    skipped: list[Skipped] = []
    specs_by_dir: dict[str, list[tuple[str, pathspec.PathSpec]]] = {}
    for folder, dirnames, filenames in os.walk(root):
        here = Path(folder)
        relative_dir = "" if here == root else here.relative_to(root).as_posix()
        specs = list(specs_by_dir.get(relative_dir, []))
        if (spec := _ignore_spec(here)) is not None:
            specs.append((relative_dir, spec))
        kept_dirs = []
        for name in sorted(dirnames):
            relative = f"{relative_dir}/{name}" if relative_dir else name
            path = here / name
            if name in NEVER_PACKED_DIRS or (path / "pyvenv.cfg").exists() or _ignored(relative, True, specs):
                continue
            if path.is_symlink():
                skipped.append(Skipped(relative, "a link to a folder (not followed)"))
                continue
            kept_dirs.append(name)
            specs_by_dir[relative] = specs
        dirnames[:] = kept_dirs
        for name in sorted(filenames):
            relative = f"{relative_dir}/{name}" if relative_dir else name
            path = here / name
            if name.endswith(NEVER_PACKED_SUFFIXES) or _ignored(relative, False, specs):
                continue
            if path.is_symlink():
                target = path.resolve()
                if not target.is_file() or root not in target.parents:
                    skipped.append(Skipped(relative, "a link to something outside the folder"))
                    continue
            if not path.is_file():
                skipped.append(Skipped(relative, "not a regular file"))
                continue
            size = path.stat().st_size
            if size > max_file_bytes:
                skipped.append(Skipped(relative, f"{human_size(size)}, over the {human_size(max_file_bytes)} limit for "
                                                 "a source file (ship data as a dataset, or raise --max-file-size)"))
                continue
            files.append((relative, path))
    if not files:
        raise PackError(f"{source_dir} has no files to send")
    buffer = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for relative, path in files:
            info = tarfile.TarInfo(relative)
            stat = path.stat()
            info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644 | (stat.st_mode & 0o111)
            total += stat.st_size
            with open(path, "rb") as content:
                archive.addfile(info, content)
    data = buffer.getvalue()
    if len(data) > MAX_ARCHIVE_BYTES:
        raise PackError(f"the packed source is {human_size(len(data))}; the studio takes at most "
                        f"{human_size(MAX_ARCHIVE_BYTES)} (leave data out with .gitignore and ship it as a dataset)")
    return PackedSource(data=data, files=[relative for relative, _ in files], skipped=skipped, total_bytes=total)
