"""Content identity of a dataset version: one SHA-256 over every file's relative path,
size and own SHA-256, in path order. The same files under another folder or bucket
hash the same; a renamed or changed file does not."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def combine_content_hash(files: Iterable[tuple[str, int, str]]) -> str:
    """files: (relative_path, size, sha256 hex) for each file."""
    digest = hashlib.sha256()
    for path, size, file_hash in sorted(files):
        digest.update(f"{path}\0{size}\0{file_hash}\n".encode())
    return digest.hexdigest()


def combine_fingerprint(source_uri: str, entries: Iterable[tuple[str, int, str]]) -> str:
    """A cheap identity of a source from its listing (path, size, ETag or mtime)."""
    digest = hashlib.sha256(source_uri.encode() + b"\n")
    for path, size, fingerprint in sorted(entries):
        digest.update(f"{path}\0{size}\0{fingerprint}\n".encode())
    return digest.hexdigest()
