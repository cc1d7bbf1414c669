"""Custom training scripts: a .py file or a .tar.gz source folder, stored in the object
store under scripts/<project>/<content hash>/ and named by jobs (`script.uri`)."""

from __future__ import annotations

import hashlib
import io
import posixpath
import tarfile
from dataclasses import dataclass

from datasets.storage import default_store, object_uri
from studio.errors import ActionError

MAX_SCRIPT_BYTES = 200 * 1024 * 1024
MAX_ARCHIVE_MEMBERS = 10_000


class ScriptError(ActionError):
    """An upload that is not a runnable script; the API answers 400 on `file`."""

    def __init__(self, message: str):
        super().__init__(message, fields={"file": message})


@dataclass(frozen=True)
class StoredScript:
    uri: str
    entry_point: str
    size: int
    sha256: str
    files: list[str]


def _archive_members(data: bytes) -> list[str]:
    """The archive's file names, refusing anything that could land outside the folder it
    is unpacked into (absolute paths, '..', links, devices)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            members = archive.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ScriptError(f"not a readable .tar.gz archive: {exc}") from exc
    if len(members) > MAX_ARCHIVE_MEMBERS:
        raise ScriptError(f"the archive has {len(members)} entries; at most {MAX_ARCHIVE_MEMBERS} are allowed")
    names = []
    for member in members:
        name = posixpath.normpath(member.name)
        if member.name.startswith("/") or name == ".." or name.startswith("../"):
            raise ScriptError(f"the archive entry {member.name!r} would be unpacked outside its folder")
        if not (member.isfile() or member.isdir()):
            raise ScriptError(f"the archive entry {member.name!r} is a link or a special file; only files and folders are allowed")
        if member.isfile():
            names.append(name.removeprefix("./"))
    return sorted(names)


def _guess_entry_point(files: list[str]) -> str:
    python = [f for f in files if f.endswith(".py")]
    for preferred in ("train.py", "main.py", "entry_point.py"):
        if preferred in python:
            return preferred
    top_level = [f for f in python if "/" not in f]
    return top_level[0] if len(top_level) == 1 else ""


def store_script(project_slug: str, filename: str, data: bytes) -> StoredScript:
    name = posixpath.basename(filename.replace("\\", "/"))
    if not data:
        raise ScriptError(f"{name or 'the file'} is empty (0 bytes)")
    if len(data) > MAX_SCRIPT_BYTES:
        raise ScriptError(f"scripts are limited to {MAX_SCRIPT_BYTES // (1024 * 1024)} MiB; ship data as a dataset instead")
    if name.endswith(".py"):
        try:
            compile(data, name, "exec")
        except SyntaxError as exc:
            raise ScriptError(f"{name} line {exc.lineno}: {exc.msg}") from exc
        files = [name]
    elif name.endswith((".tar.gz", ".tgz")):
        files = _archive_members(data)
        if not any(f.endswith(".py") for f in files):
            raise ScriptError("the archive holds no .py file")
    else:
        raise ScriptError("upload a .py file or a .tar.gz of a source folder")
    digest = hashlib.sha256(data).hexdigest()
    uri = object_uri(f"scripts/{project_slug}/{digest[:16]}/{name}")
    with default_store().open_write(uri) as out:
        out.write(data)
    return StoredScript(uri=uri, entry_point=_guess_entry_point(files), size=len(data), sha256=digest, files=files)
