"""Small helpers every app's pages share: whether the viewer may write in a project, and
durations and values written the way people read them."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest

from studio.views import project_roles


def can_write_in(request: HttpRequest, project_id: int) -> bool:
    return any(entry.project.pk == project_id and entry.can_write for entry in project_roles(request))


def duration_text(seconds: float | None) -> str:
    """42 → "42 s", 312 → "5 min 12 s", 7380 → "2 h 3 min"; None → "—"."""
    if seconds is None:
        return "—"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days {hours % 24} h"


def shown_value(value: Any, *, digits: int | None = None) -> str:
    """A hyperparameter or metric as people typed or read it: 0.0001 stays 0.0001 (not
    1.000e-04), booleans as JSON writes them, "—" for none. `digits` rounds metrics."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.{digits}g}" if digits else repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)
