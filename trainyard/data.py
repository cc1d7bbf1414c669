"""Reading a job's input channel, whichever way it was staged.

In `file` mode the channel folder (SM_CHANNEL_<NAME>) holds the files. In `stream` mode it
holds only `manifest.json`, written by the node agent, listing the dataset version's files
by URI; this module reads them from the object store while training:

    from trainyard import data
    for line in data.iter_lines(os.environ["SM_CHANNEL_TRAIN"]):   # CSV: header first
        ...
    for path, stream in data.open_files(os.environ["SM_CHANNEL_TRAIN"]):
        ...

file:// URIs are opened directly, s3:// through boto3 (credentials and AWS_ENDPOINT_URL
from the environment). For a version split by seed, `iter_lines` yields only the records
the split gives this channel, read and numbered by `trainyard.records` as validation
numbered them. No Django.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from trainyard.records import channel_selector, csv_delimiter, iter_records, open_text

MANIFEST = "manifest.json"


def read_manifest(channel_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The stream-mode manifest of the channel, or None for a file-mode channel."""
    path = Path(channel_dir) / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def open_uri(uri: str) -> IO[bytes]:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return open(unquote(parsed.path), "rb")  # noqa: SIM115 - the caller closes it
    if parsed.scheme == "s3":
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
                                                config=Config(s3={"addressing_style": "path"}))
        return client.get_object(Bucket=parsed.netloc, Key=unquote(parsed.path).lstrip("/"))["Body"]
    raise ValueError(f"{uri}: only file:// and s3:// URIs can be read")


def _entries(channel_dir: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    manifest = read_manifest(channel_dir)
    if manifest is not None:
        return manifest, list(manifest["files"])
    root = Path(channel_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return None, [{"path": p.relative_to(root).as_posix(), "uri": p.resolve().as_uri(), "split": False} for p in files]


def open_files(channel_dir: str | os.PathLike[str]) -> Iterator[tuple[str, IO[bytes]]]:
    """(path, binary stream) of every file of the channel, in order. Files of a split
    version hold every channel's records: use iter_lines to get only this channel's."""
    for entry in _entries(channel_dir)[1]:
        with open_uri(entry["uri"]) as stream:
            yield entry["path"], stream


def iter_lines(channel_dir: str | os.PathLike[str]) -> Iterator[str]:
    """The channel's records as text lines (each ending in "\\n"): JSON Lines and text
    records; for CSV the first file's header once, then each row's text (a quoted field
    may span lines). Blank lines are skipped, as validation skipped them."""
    manifest, entries = _entries(channel_dir)
    file_format = (manifest or {}).get("format") or _guess_format(entries)
    split, channel = (manifest or {}).get("split"), (manifest or {}).get("channel")
    header_sent = False
    for entry in entries:
        keep = None
        if entry.get("split") and split and channel:
            keep = channel_selector(split, channel, int(entry.get("first_index") or 0))
        delimiter = csv_delimiter(entry["path"], (manifest or {}).get("delimiter") or "")
        with open_uri(entry["uri"]) as stream:
            for number, record in iter_records(open_text(stream), file_format, delimiter):
                if number is None:
                    if not header_sent:
                        header_sent = True
                        yield record
                elif keep is None or keep(number):
                    yield record


def _guess_format(entries: list[dict[str, Any]]) -> str:
    names = [entry["path"].lower() for entry in entries]
    if names and all(name.endswith((".csv", ".tsv")) for name in names):
        return "csv"
    if names and all(name.endswith(".txt") for name in names):
        return "text"
    return "jsonl"
