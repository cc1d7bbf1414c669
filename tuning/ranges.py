"""The search space: `parameter_ranges` checked and turned into Optuna distributions, grid
points and a representative value per range.

    {"lr": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"},
     "dropout": {"type": "continuous", "min": 0, "max": 0.5, "step": 0.1},
     "layers": {"type": "integer", "min": 1, "max": 4},
     "optimizer": {"type": "categorical", "values": ["adam", "sgd"]}}

`scale` is "linear" (default) or "log"; `step` (optional, linear scale only) makes a range
discrete. A grid search needs every range discrete: integer, categorical, or continuous
with a step. Optuna's own GridSampler numbers grid points by trial number, which a study
rebuilt from the database with warm-start trials in it would break, so the engine walks the
grid itself, in order (grid_points).
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

RANGE_TYPES = ("continuous", "integer", "categorical")
SCALES = ("linear", "log")
MAX_PARAMETERS = 30
MAX_VALUES = 1000
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
_KEYS = {
    "continuous": {"type", "min", "max", "scale", "step"},
    "integer": {"type", "min", "max", "scale", "step"},
    "categorical": {"type", "values"},
}
EXAMPLE = '{"type": "continuous", "min": 0.0001, "max": 0.1, "scale": "log"}'
# Grid sizes are counted up to here (a product of many ranges can be astronomically large).
GRID_COUNT_LIMIT = 10**9


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _integer(value: Any) -> int | None:
    number = _number(value)
    if number is None or not number.is_integer():
        return None
    return int(number)


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def check_ranges(raw: Any) -> tuple[dict[str, dict], dict[str, Any]]:
    """(the ranges, normalised; errors as {name: {field: message}} or {name: message})."""
    if not isinstance(raw, dict) or not raw:
        return {}, {"": f"Give at least one hyperparameter to tune, e.g. {{\"lr\": {EXAMPLE}}}."}
    if len(raw) > MAX_PARAMETERS:
        return {}, {"": f"At most {MAX_PARAMETERS} hyperparameters can be tuned at once."}
    clean: dict[str, dict] = {}
    errors: dict[str, Any] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not NAME.match(name):
            errors[str(name)] = "Hyperparameter names start with a letter or _ and use letters, digits, _ . -"
            continue
        if not isinstance(spec, dict):
            errors[name] = f"Give a range object, e.g. {EXAMPLE}."
            continue
        range_errors: dict[str, str] = {}
        kind = spec.get("type")
        if kind not in RANGE_TYPES:
            range_errors["type"] = (f"Unknown range type {kind!r}; use continuous, integer or categorical."
                                    if kind is not None else "This field is required (continuous, integer or categorical).")
            errors[name] = range_errors
            continue
        unknown = sorted(set(spec) - _KEYS[kind])
        for key in unknown:
            range_errors[str(key)] = f"A {kind} range takes {', '.join(sorted(_KEYS[kind] - {'type'}))}, not {key!r}."
        normalised = _check_categorical(spec, range_errors) if kind == "categorical" else _check_numeric(kind, spec, range_errors)
        if range_errors:
            errors[name] = range_errors
        else:
            clean[name] = normalised
    return clean, errors


def _check_categorical(spec: dict, errors: dict[str, str]) -> dict:
    values = spec.get("values")
    if not isinstance(values, list) or not values:
        errors["values"] = 'Give a non-empty list of values to try, e.g. ["adam", "sgd"].'
        return {}
    if len(values) > MAX_VALUES:
        errors["values"] = f"At most {MAX_VALUES} values."
        return {}
    seen: set[tuple[str, Any]] = set()
    for value in values:
        if isinstance(value, float) and not math.isfinite(value):
            errors["values"] = f"{value!r} is not a finite number."
            return {}
        if not isinstance(value, (str, int, float, bool)):
            errors["values"] = f"Values are strings, numbers or booleans, not {value!r}."
            return {}
        key = value_key(value)
        if key in seen:
            errors["values"] = f"{value!r} is listed twice."
            return {}
        seen.add(key)
    return {"type": "categorical", "values": list(values)}


def _check_numeric(kind: str, spec: dict, errors: dict[str, str]) -> dict:
    parse = _integer if kind == "integer" else _number
    what = "an integer" if kind == "integer" else "a number"
    bounds: dict[str, Any] = {}
    for bound in ("min", "max"):
        if bound not in spec:
            errors[bound] = "This field is required."
            continue
        value = parse(spec[bound])
        if value is None:
            errors[bound] = f"Expected {what}, got {spec[bound]!r}."
        else:
            bounds[bound] = value
    scale = spec.get("scale", "linear")
    if scale not in SCALES:
        errors["scale"] = f"Use 'linear' or 'log', not {scale!r}."
    step = None
    if spec.get("step") is not None:
        step = parse(spec["step"])
        if step is None or step <= 0:
            errors["step"] = f"Expected a positive {'integer' if kind == 'integer' else 'number'}, got {spec['step']!r}."
        elif scale == "log" and not (kind == "integer" and step == 1):
            errors["step"] = "A step works on a linear scale only."
    if errors or len(bounds) < 2:
        return {}
    low, high = bounds["min"], bounds["max"]
    if low > high:
        errors["min"] = f"min ({_show(low)}) is greater than max ({_show(high)})."
        return {}
    if scale == "log" and low <= 0:
        errors["min"] = f"A log scale needs min > 0; got {_show(low)}."
        return {}
    normalised: dict[str, Any] = {"type": kind, "min": low, "max": high, "scale": scale}
    if step is not None:
        if kind == "continuous":
            # Optuna keeps a stepped range's max on the grid (min + k·step): say so up front.
            count = math.floor((high - low) / step + 1e-9)
            normalised["max"] = _round(low + count * step)
        else:
            normalised["max"] = low + (high - low) // step * step
        normalised["step"] = step
    return normalised


def _round(value: float) -> float:
    """Grid arithmetic without float noise (0.1 + 0.2 → 0.3)."""
    return float(f"{value:.12g}")


def value_key(value: Any) -> tuple[str, Any]:
    """Equality for parameter values across JSON round trips: True is not 1, 1 is 1.0."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", _round(float(value)))
    return ("text", str(value))


def params_key(params: dict[str, Any], names: list[str]) -> tuple:
    return tuple(value_key(params.get(name)) for name in names)


def distribution(spec: dict) -> BaseDistribution:
    kind, log = spec["type"], spec.get("scale") == "log"
    if kind == "categorical":
        return CategoricalDistribution(spec["values"])
    if kind == "integer":
        return IntDistribution(int(spec["min"]), int(spec["max"]), log=log, step=int(spec.get("step") or 1))
    return FloatDistribution(float(spec["min"]), float(spec["max"]), log=log, step=spec.get("step"))


def distributions(ranges: dict[str, dict]) -> dict[str, BaseDistribution]:
    return {name: distribution(spec) for name, spec in sorted(ranges.items())}


def fits(spec: dict, value: Any) -> bool:
    """Whether `value` (e.g. a warm-start trial's) lies in this range."""
    if spec["type"] == "categorical":
        return value_key(value) in {value_key(v) for v in spec["values"]}
    number = _integer(value) if spec["type"] == "integer" else _number(value)
    if number is None or not float(spec["min"]) <= number <= float(spec["max"]):
        return False
    step = spec.get("step")
    if not step:
        return True
    offset = (number - float(spec["min"])) / float(step)
    return abs(offset - round(offset)) < 1e-8


def is_discrete(spec: dict) -> bool:
    return spec["type"] in ("integer", "categorical") or spec.get("step") is not None


def values_of(spec: dict) -> list[Any]:
    """The points of a discrete range, in order."""
    if spec["type"] == "categorical":
        return list(spec["values"])
    if spec["type"] == "integer":
        return list(range(int(spec["min"]), int(spec["max"]) + 1, int(spec.get("step") or 1)))
    step, low = float(spec["step"]), float(spec["min"])
    count = math.floor((float(spec["max"]) - low) / step + 1e-9)
    return [_round(low + i * step) for i in range(count + 1)]


def grid_size(ranges: dict[str, dict]) -> int:
    size = 1
    for spec in ranges.values():
        if spec["type"] == "categorical":
            size *= len(spec["values"])
        elif spec["type"] == "integer":
            size *= (int(spec["max"]) - int(spec["min"])) // int(spec.get("step") or 1) + 1
        else:
            size *= math.floor((float(spec["max"]) - float(spec["min"])) / float(spec["step"]) + 1e-9) + 1
        if size > GRID_COUNT_LIMIT:
            return GRID_COUNT_LIMIT + 1
    return size


def grid_points(ranges: dict[str, dict]) -> list[dict[str, Any]]:
    """Every grid point, parameters in name order, the last name varying fastest."""
    names = sorted(ranges)
    return [dict(zip(names, combination, strict=True))
            for combination in itertools.product(*(values_of(ranges[name]) for name in names))]


def representative(spec: dict) -> Any:
    """A value inside the range, to check the base job with before any trial runs: the
    midpoint (geometric on a log scale) of a numeric range, the first value of a list."""
    if spec["type"] == "categorical":
        return spec["values"][0]
    low, high = float(spec["min"]), float(spec["max"])
    middle = math.sqrt(low * high) if spec.get("scale") == "log" else (low + high) / 2
    if spec["type"] == "integer":
        int_step = int(spec.get("step") or 1)
        return int(spec["min"]) + round((middle - low) / int_step) * int_step
    if spec.get("step"):
        step = float(spec["step"])
        return _round(low + round((middle - low) / step) * step)
    return middle
