"""What the rule engine's parts share: the names of types, states and statistics, the
error a bad rule raises, and small number and wording helpers (jobs.rules.engine)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

OK, ALARM, INSUFFICIENT_DATA = "OK", "ALARM", "INSUFFICIENT_DATA"
STATES: tuple[str, ...] = (OK, ALARM, INSUFFICIENT_DATA)
BUILTIN_TYPES: tuple[str, ...] = ("non_finite", "loss_not_decreasing", "overfit", "overtraining", "stalled",
                                  "max_init_time", "low_gpu_utilization", "step_outlier", "budget")
RULE_TYPES: tuple[str, ...] = BUILTIN_TYPES + ("custom",)
ACTION_TYPES: tuple[str, ...] = ("stop", "notify", "tag")
RULE_KEYS: tuple[str, ...] = ("name", "type", "parameters", "actions", "enabled")
STATISTICS: tuple[str, ...] = ("last", "mean", "min", "max", "sum", "pNN")
COMPARISONS: dict[str, str] = {
    ">": ">", ">=": ">=", "<": "<", "<=": "<=",
    "GreaterThanThreshold": ">", "GreaterThanOrEqualToThreshold": ">=",
    "LessThanThreshold": "<", "LessThanOrEqualToThreshold": "<=",
}
MISSING_DATA_POLICIES: tuple[str, ...] = ("missing", "breaching", "notBreaching", "ignore")
NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
TAG_MAX_CHARS = 64
SEEN_NAMES_LISTED = 10

_INF = math.inf
_isfinite = math.isfinite


class RuleError(ValueError):
    """A rule that cannot be accepted: `field` is the path inside the rule ("type",
    "parameters.window", "actions[1].channels", "rules[2].name"; "" for a rule that is not
    an object at all), `message` what to do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def under(self, prefix: str) -> RuleError:
        return RuleError(f"{prefix}.{self.field}" if self.field else prefix, self.message)



# --- Small helpers ------------------------------------------------------------------------

def _relative_change(value: float, base: float) -> float:
    if base != 0:
        return (value - base) / abs(base)
    if value == base:
        return 0.0
    return _INF if value > base else -_INF


def _percentile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default) on sorted values."""
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    if fraction == 0:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def _statistic(name: str) -> Callable[[list[float]], float]:
    if name == "last":
        return lambda values: values[-1]
    if name == "mean":
        return lambda values: sum(values) / len(values)
    if name == "min":
        return min
    if name == "max":
        return max
    if name == "sum":
        return lambda values: float(sum(values))
    q = float(name[1:])
    return lambda values: _percentile(sorted(values), q) if len(values) > 1 else values[0]


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (_INF, -_INF):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _fmt(value: float | None) -> str:
    if value is None:
        return "none"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value != value:
        return "NaN"
    if value in (_INF, -_INF):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.6g}"


def _fmt_cost(value: float | None) -> str:
    """Cents, or the significant digits of an amount under a cent (a limit of 0.000001 is
    not "0.00")."""
    if value is None:
        return "unknown"
    if value != 0 and abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.2f}"


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not _isfinite(value):
        return _fmt(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _listing(items: Any, last: str = "or") -> str:
    names = [str(item) for item in items]
    if len(names) <= 2:
        return f" {last} ".join(names)
    return ", ".join(names[:-1]) + f" {last} " + names[-1]


