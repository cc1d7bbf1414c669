"""Typed readers for settings that come from the environment.

Each helper fails loudly on a malformed value, naming the variable, so a typo in a
deployment is a start-up error rather than a silent default.
"""

from __future__ import annotations

import os
from pathlib import Path


class SettingError(ValueError):
    pass


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise SettingError(f"{name} must be an integer, got {raw!r}") from exc


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise SettingError(f"{name} must be true or false, got {raw!r}")


def env_paths(name: str, default: list[Path]) -> list[Path]:
    """A list of directories separated by os.pathsep (':' on Linux and macOS)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [Path(part).expanduser() for part in raw.split(os.pathsep) if part.strip()]
