"""Reports a training process writes about itself (how a pipeline was partitioned, what a
sharded run actually ran): `<TRAINYARD_REPORT_DIR>/<name>.json`, which node 0's agent copies
into the job's `details` for its page and the API.

    from trainyard import report
    report.write("partition", {"mode": "auto", ...})

Rank 0 only, and only inside a job (TRAINYARD_REPORT_DIR set): a script run by hand writes
nothing. A report is informative: failing to write one warns and never stops training.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from trainyard import protocol

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def report_dir() -> Path | None:
    """Where rank 0 writes reports; None on other ranks and outside a job."""
    folder = os.environ.get(protocol.ENV_REPORT_DIR, "")
    rank = os.environ.get("RANK", "").strip() or "0"
    if not folder or rank != "0":
        return None
    return Path(folder)


def write(name: str, data: dict[str, Any]) -> None:
    """Replace report `name` with `data` atomically (a temporary file renamed over it), so
    the agent copying the folder never reads half a report."""
    if not _NAME.match(name):
        raise ValueError(f"report name {name!r}: use lower-case letters, digits, '-' and '_'")
    folder = report_dir()
    if folder is None:
        return
    # allow_nan=False: the studio stores reports as JSON, where NaN does not exist.
    text = json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    temporary = folder / f".{name}.json.tmp-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, folder / f"{name}.json")
    except OSError as exc:
        sys.stderr.write(f"warning: could not write report {name} to {folder}: {exc}\n")
        temporary.unlink(missing_ok=True)
