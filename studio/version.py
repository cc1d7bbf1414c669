"""The studio's version, and what a node reports about its software (the Nodes page shows
it: nodes of one gang should run the same torch)."""

from __future__ import annotations

import platform
from importlib import metadata

VERSION = "1.0.0"


def node_software() -> str:
    """'1.0.0 · torch 2.13.0+cpu · py3.11.7', read from package metadata (no torch import)."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "none"
    return f"{VERSION} · torch {torch} · py{platform.python_version()}"[:64]
