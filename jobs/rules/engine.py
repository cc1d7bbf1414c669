"""The rule engine, Django-free: checking a rule's spec (`check_rule`, `check_rules`) and
evaluating it on one job's stream (`evaluator(spec, started_at=...)`), returning the state
transitions (OK, ALARM, INSUFFICIENT_DATA) the watcher stores and acts on.

Decisions a reader needs (the issue left them open):

1. Stream order. `observe` takes all of a job's new points in stream order (every metric,
   every rank). `non_finite` looks at every rank; the curve-shape rules
   (`loss_not_decreasing`, `overfit`, `overtraining`, `step_outlier`) and `custom` (its
   `rank` parameter, default 0) use one rank only, so N ranks logging the same loss do not
   count N times.
2. Replays. Points are unique on (job, name, step, rank), and a resumed run re-sends steps
   from its checkpoint: the curve rules and `custom` skip a point whose step is at or below
   the last step they used of that metric (a replay or an out-of-order point), so a restart
   neither doubles a window nor compares a loss with itself. `step_outlier` instead restarts
   its step clock there (the gap across a restart is not a step time).
3. Non-finite values. `non_finite` is the rule for them; the other curve rules skip NaN/±Inf
   points. In a `custom` period NaN values are dropped; a period with nothing left is a
   missing datapoint and follows `treat_missing_data` (as does a NaN statistic, e.g. the mean
   of +Inf and -Inf); ±Inf compares as a number.
4. "M of N" (`custom`). The last N datapoints: ≥ M breaching → ALARM at once, even before N
   exist (the breaching ones are in every window of N that ends now); otherwise OK once N
   exist; before that the state is kept (INSUFFICIENT_DATA for a new rule, the restored state
   after a watcher restart). With `treat_missing_data` "missing", a missing period takes a
   place in the window without breaching, and N missing periods in a row → INSUFFICIENT_DATA;
   "breaching"/"notBreaching" turn it into such a datapoint; "ignore" leaves the window and
   the state alone. Periods close by arrival, every `window` points; missing periods come
   from `tick` when no point of the metric arrived for `missing_after_seconds` (counted from
   `started_at` until the first point). Percentiles interpolate linearly (numpy's default).
5. Cool-down (every type, `cooldown_seconds`): a transition into ALARM within that time of
   the last one that fired is recorded with fire=False.
6. Clocks. Point times are the job's clock; `tick(now)` is the watcher's. `stalled` and the
   missing-data timer measure from the latest point time they saw. `observe_activity`'s
   ALARM → OK for `stalled` comes out of the next observe/observe_gpu/tick call.
   `max_init_time` stays ALARM once the first step came late (the start took too long; that
   stays true). `tick(finished=True)` evaluates nothing (silence after the end is not a
   stall, a final cost after the end stops nothing): it only says "never got data" for a rule
   still INSUFFICIENT_DATA, once, and after it no call returns transitions.
7. Speed. The watcher hands the same batch to every rule of the job: the batch is grouped
   by (metric, rank) once and the grouping is kept for the next call with the same sequence
   object (treat a batch as immutable while the job's rules read it), so a rule costs a dict
   look-up per batch for metrics it does not watch and a few operations per point it does;
   a custom rule whose whole batch sits on its state's side (no breach while OK) moves
   nothing and skips the per-datapoint loop.
"""

from __future__ import annotations

import copy
import math
import operator
import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

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


# --- Checking -------------------------------------------------------------------------------

_REQUIRED = object()


@dataclass(frozen=True)
class _Param:
    kind: str  # int | float | bool | regex | metric | choice | statistic | comparison
    default: Any = _REQUIRED
    low: float | None = None
    high: float | None = None
    low_exclusive: bool = False
    choices: tuple[str, ...] = ()


_MAX_STEP = 10**15
_MAX_SECONDS = 1e8  # about three years
_COMMON: dict[str, _Param] = {"cooldown_seconds": _Param("float", 0.0, 0, _MAX_SECONDS)}
_SCHEMAS: dict[str, dict[str, _Param]] = {
    "non_finite": {"metrics": _Param("regex", "(?i)loss")},
    "loss_not_decreasing": {
        "metric": _Param("metric", "train_loss"), "num_steps": _Param("int", 10, 1, 10000),
        "diff_percent": _Param("float", 0.1, 0, 100), "warmup_steps": _Param("int", 0, 0, _MAX_STEP)},
    "overfit": {
        "train_metric": _Param("metric", "train_loss"), "validation_metric": _Param("metric", "validation_loss"),
        "ratio_threshold": _Param("float", 0.1, -1e6, 1e6), "patience": _Param("int", 1, 1, 10000),
        "start_step": _Param("int", 0, 0, _MAX_STEP)},
    "overtraining": {
        "metric": _Param("metric", "validation_loss"), "mode": _Param("choice", "min", choices=("min", "max")),
        "patience": _Param("int", 5, 1, 10000), "window": _Param("int", 10, 1, 10000), "delta": _Param("float", 0.0, 0, 1e300)},
    "stalled": {"threshold_seconds": _Param("float", 1800.0, 1, _MAX_SECONDS)},
    "max_init_time": {"threshold_seconds": _Param("float", 1200.0, 1, _MAX_SECONDS)},
    "low_gpu_utilization": {
        "threshold_p95": _Param("float", 70.0, 0, 100), "threshold_p5": _Param("float", 10.0, 0, 100),
        "window": _Param("int", 500, 10, 100000), "warmup_samples": _Param("int", 50, 0, 10**9)},
    "step_outlier": {
        "metric": _Param("metric", "train_loss"), "stddev": _Param("float", 5.0, 0, 1000, low_exclusive=True),
        "window": _Param("int", 100, 2, 10000), "min_steps": _Param("int", 10, 2, 10000)},
    "budget": {"limit": _Param("float", _REQUIRED, 0, 1e12, low_exclusive=True), "projected": _Param("bool", True)},
    "custom": {
        "metric": _Param("metric"), "statistic": _Param("statistic", "last"), "window": _Param("int", 1, 1, 10000),
        "comparison": _Param("comparison", ">"), "threshold": _Param("float", None, -1e300, 1e300),
        "compare_to": _Param("choice", "threshold", choices=("threshold", "previous_window")),
        "evaluation_periods": _Param("int", 1, 1, 1000), "datapoints_to_alarm": _Param("int", None, 1, 1000),
        "warmup_steps": _Param("int", 0, 0, _MAX_STEP),
        "treat_missing_data": _Param("choice", "missing", choices=MISSING_DATA_POLICIES),
        "missing_after_seconds": _Param("float", 300.0, 1, _MAX_SECONDS), "rank": _Param("int", 0, 0, 65535)},
}
for _schema in _SCHEMAS.values():
    _schema.update(_COMMON)
_DEFAULT_STOP = ("non_finite", "budget")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_number(path: str, value: object, spec: _Param) -> int | float:
    want = "an integer" if spec.kind == "int" else "a number"
    bounds = f"{'more than' if spec.low_exclusive else 'from'} {_fmt(spec.low)} {'up ' if spec.low_exclusive else ''}to {_fmt(spec.high)}"
    if not _is_number(value):
        raise RuleError(path, f"must be {want} {bounds}, not {_describe(value)}.")
    assert isinstance(value, int | float)
    if not _isfinite(value):
        raise RuleError(path, f"must be a finite number {bounds}, not {_fmt(value)}.")
    if spec.kind == "int":
        if isinstance(value, float):
            if not value.is_integer():
                raise RuleError(path, f"must be an integer {bounds}, not {value!r}.")
            value = int(value)
    else:
        value = float(value)
    assert spec.low is not None and spec.high is not None
    if value < spec.low or value > spec.high or (spec.low_exclusive and value == spec.low):
        raise RuleError(path, f"must be {want} {bounds}, not {_fmt(value)}.")
    return value


def _check_param(path: str, value: object, spec: _Param) -> Any:
    if spec.kind in ("int", "float"):
        return _check_number(path, value, spec)
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise RuleError(path, f"must be true or false, not {_describe(value)}.")
        return value
    if spec.kind == "metric":
        if not isinstance(value, str) or not 1 <= len(value) <= 200:
            raise RuleError(path, f"must be a metric name (1 to 200 characters), not {_describe(value)}.")
        return value
    if spec.kind == "regex":
        if not isinstance(value, str) or not 1 <= len(value) <= 500:
            raise RuleError(path, f"must be a regular expression on metric names (1 to 500 characters), not {_describe(value)}.")
        try:
            re.compile(value)
        except re.error as exc:
            raise RuleError(path, f"is not a valid regular expression ({exc}); e.g. \"(?i)loss\".") from None
        return value
    if spec.kind == "choice":
        if value not in spec.choices or not isinstance(value, str):
            raise RuleError(path, f"must be one of {_listing(spec.choices)}, not {_describe(value)}.")
        return value
    if spec.kind == "comparison":
        if not isinstance(value, str) or value not in COMPARISONS:
            raise RuleError(path, f"must be one of {_listing(COMPARISONS)}, not {_describe(value)}.")
        return COMPARISONS[value]
    if spec.kind == "statistic":
        return _check_statistic(path, value)
    raise AssertionError(spec.kind)


def _check_statistic(path: str, value: object) -> str:
    message = f'must be "last", "mean", "min", "max", "sum" or a percentile "p0" to "p100" (e.g. "p90", "p99.9"), not {_describe(value)}.'
    if not isinstance(value, str):
        raise RuleError(path, message)
    if value in ("last", "mean", "min", "max", "sum"):
        return value
    match = re.fullmatch(r"p(\d{1,3}(?:\.\d{1,6})?)", value)
    if match is None or float(match.group(1)) > 100:
        raise RuleError(path, message)
    return f"p{float(match.group(1)):g}"


def _check_parameters(rule_type: str, raw: object) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RuleError("parameters", f"must be an object of the {rule_type} rule's parameters, not {_describe(raw)}.")
    schema = _SCHEMAS[rule_type]
    unknown = [str(key) for key in raw if key not in schema]
    if unknown:
        raise RuleError(f"parameters.{unknown[0]}", f"is not a parameter of a {rule_type} rule; its parameters are "
                                                     f"{_listing(schema)}.")
    params: dict[str, Any] = {}
    for name, spec in schema.items():
        value = raw.get(name)
        if value is None:
            if spec.default is _REQUIRED:
                raise RuleError(f"parameters.{name}", f"is required for a {rule_type} rule{_required_hint(rule_type, name)}.")
            params[name] = spec.default
        else:
            params[name] = _check_param(f"parameters.{name}", value, spec)
    _check_together(rule_type, params)
    return params


def _required_hint(rule_type: str, name: str) -> str:
    if rule_type == "budget":
        return " (the most the job may cost, > 0, in the prices' currency)"
    if rule_type == "custom" and name == "metric":
        return " (the metric name the rule watches, e.g. \"train_loss\")"
    return ""


def _check_together(rule_type: str, params: dict[str, Any]) -> None:
    if rule_type == "overfit" and params["train_metric"] == params["validation_metric"]:
        raise RuleError("parameters.validation_metric", "must differ from train_metric.")
    if rule_type == "overtraining" and params["patience"] > params["window"]:
        raise RuleError("parameters.patience", f"must be at most window ({params['window']}), not {params['patience']}.")
    if rule_type == "step_outlier" and params["min_steps"] > params["window"]:
        raise RuleError("parameters.min_steps", f"must be at most window ({params['window']}), not {params['min_steps']}.")
    if rule_type == "custom":
        if params["datapoints_to_alarm"] is None:
            params["datapoints_to_alarm"] = params["evaluation_periods"]
        if params["datapoints_to_alarm"] > params["evaluation_periods"]:
            raise RuleError("parameters.datapoints_to_alarm", f"must be from 1 to evaluation_periods "
                                                             f"({params['evaluation_periods']}), not {params['datapoints_to_alarm']}.")
        if params["threshold"] is None:
            if params["compare_to"] == "threshold":
                raise RuleError("parameters.threshold", 'is required when compare_to is "threshold" (a finite number).')
            params["threshold"] = 0.0


def _check_actions(raw: object, rule_type: str, rule_name: str) -> list[dict[str, Any]]:
    if raw is None:
        return [{"type": "stop"}] if rule_type in _DEFAULT_STOP else []
    if not isinstance(raw, list):
        raise RuleError("actions", f'must be a list of actions ("stop", "notify", "tag" or objects such as '
                                   f'{{"type": "notify", "channels": ["ops"]}}), not {_describe(raw)}.')
    actions = []
    for index, item in enumerate(raw):
        path = f"actions[{index}]"
        if isinstance(item, str):
            item = {"type": item}
        if not isinstance(item, dict):
            raise RuleError(path, f"must be {_listing(ACTION_TYPES)} or an object with a \"type\", not {_describe(item)}.")
        kind = item.get("type")
        if kind not in ACTION_TYPES or not isinstance(kind, str):
            raise RuleError(f"{path}.type" if "type" in item else path,
                            f"must name an action: one of {_listing(ACTION_TYPES)}, not {_describe(kind)}.")
        known = {"stop": ("type",), "notify": ("type", "channels"), "tag": ("type", "tag")}[kind]
        unknown = [str(key) for key in item if key not in known]
        if unknown:
            raise RuleError(f"{path}.{unknown[0]}", f"is not a key of a {kind} action; its keys are {_listing(known)}.")
        action: dict[str, Any] = {"type": kind}
        if kind == "notify":
            action["channels"] = _check_channels(f"{path}.channels", item.get("channels"))
        elif kind == "tag":
            tag = item.get("tag")
            if tag is None:
                tag = f"alarm:{rule_name}"[:TAG_MAX_CHARS]
            elif not isinstance(tag, str) or not 1 <= len(tag) <= TAG_MAX_CHARS or not tag.strip():
                raise RuleError(f"{path}.tag", f"must be a tag of 1 to {TAG_MAX_CHARS} characters (default "
                                               f"\"alarm:<rule name>\"), not {_describe(tag)}.")
            action["tag"] = tag
        actions.append(action)
    return actions


def _check_channels(path: str, raw: object) -> list[str] | None:
    """None: every enabled channel of the project."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise RuleError(path, f"must be a non-empty list of the project's notification channel names (leave it out for "
                              f"all channels), not {_describe(raw)}.")
    for index, name in enumerate(raw):
        if not isinstance(name, str) or not 1 <= len(name) <= 100:
            raise RuleError(f"{path}[{index}]", f"must be a channel name (1 to 100 characters), not {_describe(name)}.")
        if name in raw[:index]:
            raise RuleError(f"{path}[{index}]", f"names channel {name!r} twice; list each channel once.")
    return list(raw)


def _default_name(rule_type: str, params: dict[str, Any]) -> str:
    if rule_type != "custom":
        return rule_type
    return ("custom-" + re.sub(r"[^A-Za-z0-9_.:-]", "_", params["metric"]))[:100]


def check_rule(raw: object, *, partial: dict | None = None) -> dict:
    """One rule as the job spec or the API gives it → the normalized rule:
    {"name", "type", "parameters" (complete), "actions" (dicts), "enabled"}. A bare string
    is a rule of that type with its defaults. With `partial` (PATCH), `raw` holds the
    changed keys of the normalized rule `partial`; parameters merge key by key (a null
    parameter goes back to its default) and the result is checked whole."""
    if isinstance(raw, str) and partial is None:
        raw = {"type": raw}
    if not isinstance(raw, dict):
        raise RuleError("", f"a rule must be an object with a \"type\" (one of {_listing(RULE_TYPES)}), not {_describe(raw)}.")
    unknown = [str(key) for key in raw if key not in RULE_KEYS]
    if unknown:
        raise RuleError(unknown[0], f"is not a key of a rule; its keys are {_listing(RULE_KEYS)}.")
    if partial is not None:
        raw = _merge(raw, partial)
    rule_type = raw.get("type")
    if not isinstance(rule_type, str) or rule_type not in RULE_TYPES:
        raise RuleError("type", f"must be one of {_listing(RULE_TYPES)}, not {_describe(rule_type)}.")
    params = _check_parameters(rule_type, raw.get("parameters"))
    name = raw.get("name")
    if name is None:
        name = _default_name(rule_type, params)
    elif not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise RuleError("name", f"must be 1 to 100 letters, digits or _ . : - (e.g. \"nan-loss\"), not {_describe(name)}.")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise RuleError("enabled", f"must be true or false, not {_describe(enabled)}.")
    actions = _check_actions(raw.get("actions"), rule_type, name)
    return {"name": name, "type": rule_type, "parameters": params, "actions": actions, "enabled": enabled}


def _merge(changes: dict, existing: dict) -> dict:
    if "type" in changes and changes["type"] != existing["type"]:
        raise RuleError("type", f"a rule's type cannot change (this one is {existing['type']!r}); delete it and add a new rule.")
    merged = copy.deepcopy(existing)
    for key, value in changes.items():
        if key != "parameters":
            merged[key] = value
            continue
        if value is None:
            continue
        if not isinstance(value, dict):
            raise RuleError("parameters", f"must be an object of the parameters to change, not {_describe(value)}.")
        params = merged.setdefault("parameters", {})
        # M defaulted to N when the rule was made: changing N alone keeps "all N" meaning all N.
        if ("evaluation_periods" in value and "datapoints_to_alarm" not in value
                and params.get("datapoints_to_alarm") == params.get("evaluation_periods")):
            params.pop("datapoints_to_alarm", None)
        for name, item in value.items():
            if item is None:
                params.pop(name, None)
            else:
                params[name] = item
    return merged


def check_rules(raw: object, *, defaults: bool = True) -> list[dict]:
    """The job spec's `rules` (None → none) → normalized rules, names unique; with `defaults`,
    each DEFAULT_RULES entry is added unless a rule of its name is given (a user turns
    non_finite off with {"type": "non_finite", "enabled": false})."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise RuleError("rules", f"must be a list of rules, not {_describe(raw)}.")
    if len(raw) > 200:
        raise RuleError("rules", f"a job takes at most 200 rules, not {len(raw)}.")
    rules: list[dict] = []
    where: dict[str, int] = {}
    for index, item in enumerate(raw):
        try:
            rule = check_rule(item)
        except RuleError as exc:
            raise exc.under(f"rules[{index}]") from None
        if rule["name"] in where:
            raise RuleError(f"rules[{index}].name", f"{rule['name']!r} is already the name of rules[{where[rule['name']]}]; "
                                                    f"give each rule of a job its own name.")
        where[rule["name"]] = index
        rules.append(rule)
    if defaults:
        rules.extend(copy.deepcopy(rule) for rule in DEFAULT_RULES if rule["name"] not in where)
    return rules


DEFAULT_RULES: tuple[dict, ...] = (check_rule({"type": "non_finite"}),)


# --- Evaluating -----------------------------------------------------------------------------

class Point(NamedTuple):
    """One metric point. A named tuple, not a frozen dataclass: the watcher makes one per
    point of every batch, and a frozen dataclass's __init__ cost ~1.4 µs here (a setattr
    per field) against ~0.15 µs for a tuple."""

    name: str
    step: int
    value: float
    time: float  # unix seconds
    rank: int = 0


@dataclass(frozen=True, slots=True)
class GpuSample:
    host: str
    gpu_index: int
    utilization: float  # 0..100
    time: float


@dataclass
class Transition:
    from_state: str
    to_state: str
    at: float  # unix seconds: the point's time, or `now` for clock-driven ones
    reason: str
    values: dict  # JSON-safe: NaN/±Inf as "NaN", "Infinity", "-Infinity"
    step: int | None
    fire: bool = True  # False inside the rule's cool-down after its last ALARM that fired


class _Group:
    """The points of one (metric, rank) in a batch, in stream order, with their positions."""

    __slots__ = ("points", "indices", "values", "steps", "times", "total", "max_time", "_ordered")

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.indices: list[int] = []
        self.values: list[float] = []
        self.steps: list[int] = []
        self.times: list[float] = []
        self.total = 0.0
        self.max_time = -_INF
        self._ordered: bool | None = None

    def ordered(self) -> bool:
        """Whether the steps strictly increase (the usual case), worked out once per batch."""
        if self._ordered is None:
            steps = self.steps
            self._ordered = len(steps) == 1 or steps == sorted(set(steps))
        return self._ordered


def _grouped(points: Sequence[Point]) -> dict[tuple[str, int], _Group]:
    """The batch's points by (metric, rank), each group in stream order. Points are tuples:
    the columns come out with zip and the groups with one comprehension per (metric, rank)
    (a batch holds few), so no Python loop runs per point but those comprehensions."""
    groups: dict[tuple[str, int], _Group] = {}
    try:
        # map(itemgetter) per column: ~20 ns a point; zip(*points) costs ~20 times that.
        names, _steps, _values, _times, ranks = (list(map(itemgetter(i), points)) for i in range(5))
    except (TypeError, IndexError, KeyError):  # not Point tuples: the slow loop
        for index, point in enumerate(points):
            group = groups.setdefault((point.name, point.rank), _Group())
            group.points.append(point)
            group.indices.append(index)
        return groups
    if len(set(names)) == 1 and len(set(ranks)) == 1:
        group = groups[(names[0], ranks[0])] = _Group()
        group.points, group.indices = list(points), list(range(len(points)))
        group.values, group.steps, group.times = list(_values), list(_steps), list(_times)
        return groups
    keys = list(zip(names, ranks, strict=True))  # noqa: B905 - equal lengths by construction
    for key in dict.fromkeys(keys):
        group = groups[key] = _Group()
        group.indices = indices = [i for i, k in enumerate(keys) if k == key]
        group.points = [points[i] for i in indices]
        group.values = [_values[i] for i in indices]
        group.steps = [_steps[i] for i in indices]
        group.times = [_times[i] for i in indices]
    return groups


class _Batch:
    __slots__ = ("source", "length", "first", "last", "groups", "min_time", "max_time")

    def __init__(self, points: Sequence[Point]) -> None:
        self.source = points
        self.length = len(points)
        self.first, self.last = points[0], points[-1]
        groups = _grouped(points)
        self.groups = groups
        self.min_time, self.max_time = _INF, -_INF
        for group in groups.values():
            if not group.values:  # the slow path of _grouped
                group.values = [p.value for p in group.points]
                group.steps = [p.step for p in group.points]
                group.times = [p.time for p in group.points]
            raw = group.values
            try:
                group.values = list(map(float, raw))
            except (TypeError, ValueError, OverflowError):  # not a number: the watcher's slip, read as NaN
                group.values = [_as_float(v) for v in raw]
            group.total = sum(group.values)
            group.max_time = max(group.times)
            self.min_time = min(self.min_time, min(group.times))
            self.max_time = max(self.max_time, group.max_time)


_last_batch: _Batch | None = None


def _batch_of(points: Sequence[Point]) -> _Batch:
    """The grouping of `points`, shared by every rule the watcher hands the same batch."""
    global _last_batch
    batch = _last_batch
    # The same list object refilled in place (a reused buffer) holds new Point objects: compare its ends too.
    if (batch is None or batch.source is not points or batch.length != len(points)
            or batch.first is not points[0] or batch.last is not points[-1]):
        batch = _last_batch = _Batch(points)
    return batch


def _as_float(value: object) -> float:
    if type(value) is float:
        return value
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return math.nan


class Evaluator:
    """One rule of one job. Feed it the job's points, GPU samples, log activity and clock
    ticks; each call returns the transitions it caused (state changes only, plus the one
    "finished without data" record)."""

    def __init__(self, spec: dict, *, started_at: float, state: str = INSUFFICIENT_DATA,
                 last_fired_at: float | None = None) -> None:
        self.spec = spec
        self.params: dict[str, Any] = spec["parameters"]
        self.enabled = bool(spec.get("enabled", True))
        self.started_at = float(started_at)
        self.state = state if state in STATES else INSUFFICIENT_DATA
        self.cooldown_seconds = float(self.params.get("cooldown_seconds", 0.0))
        self.last_fired_at = last_fired_at
        self.finished = False
        self._pending: list[Transition] = []
        self._seen: dict[str, None] = {}
        waiting = self.waiting_for()
        self.reason = (f"waiting for {waiting}" if self.state == INSUFFICIENT_DATA
                       else f"{self.state} when the watcher restarted; evaluating again from new data ({waiting})")

    # The public calls. Subclasses implement the _on_* hooks they need.

    def observe(self, points: Sequence[Point]) -> list[Transition]:
        out = self._take_pending()
        if not isinstance(points, list | tuple):
            points = list(points)
        if self.finished or not self.enabled or not points:
            return out
        batch = _batch_of(points)
        if self.state == INSUFFICIENT_DATA and len(self._seen) < SEEN_NAMES_LISTED:
            for name, _rank in batch.groups:
                if len(self._seen) < SEEN_NAMES_LISTED:
                    self._seen.setdefault(name, None)
        self._on_points(batch, out)
        return out

    def observe_gpu(self, samples: Sequence[GpuSample]) -> list[Transition]:
        out = self._take_pending()
        if self.finished or not self.enabled or not samples:
            return out
        self._on_gpu(samples, out)
        return out

    def observe_activity(self, at: float) -> None:
        if not self.finished and self.enabled:
            self._on_activity(float(at), self._pending)

    def tick(self, now: float, *, cost: float | None = None, projected_cost: float | None = None,
             first_step_at: float | None = None, finished: bool = False) -> list[Transition]:
        out = self._take_pending()
        if self.finished or not self.enabled:
            return out
        if finished:
            self.finished = True
            if self.state == INSUFFICIENT_DATA:
                wanted = self.wanted_metrics()
                seen = list(self._seen)
                reason = (f"the job ended before this rule got data: it waited for {self.waiting_for()}; "
                          f"the job reported {_listing(seen, 'and') if seen else 'no metric points'}")
                out.append(Transition(INSUFFICIENT_DATA, INSUFFICIENT_DATA, float(now), reason,
                                      {"wanted": wanted, "seen": seen, "never_got_data": True}, None))
                self.reason = reason
            return out
        self._on_tick(float(now), cost, projected_cost, first_step_at, out)
        return out

    def waiting_for(self) -> str:
        """What the rule needs before it can say OK or ALARM, for its INSUFFICIENT_DATA reason."""
        metrics = self.wanted_metrics()
        return f"the first point of {_listing(metrics, 'and')}" if metrics else "data"

    def wanted_metrics(self) -> list[str]:
        return []

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        pass

    def _on_gpu(self, samples: Sequence[GpuSample], out: list[Transition]) -> None:
        pass

    def _on_activity(self, at: float, out: list[Transition]) -> None:
        pass

    def _on_tick(self, now: float, cost: float | None, projected_cost: float | None, first_step_at: float | None,
                 out: list[Transition]) -> None:
        pass

    def _take_pending(self) -> list[Transition]:
        if not self._pending:
            return []
        out, self._pending = self._pending, []
        return out

    def _move(self, out: list[Transition], to_state: str, at: float, reason: str, values: dict, step: int | None) -> None:
        """Record a change of state (nothing when `to_state` is the state already)."""
        if to_state == self.state:
            return
        if not _isfinite(at):  # a point without a usable time (the watcher's slip): date it at the start
            at = self.started_at
        fire = True
        if to_state == ALARM:
            if self.last_fired_at is not None and at - self.last_fired_at < self.cooldown_seconds:
                fire = False
            else:
                self.last_fired_at = at
        out.append(Transition(self.state, to_state, at, reason, _json_safe(values), step, fire))
        self.state, self.reason = to_state, reason


class _NonFinite(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        self._pattern = re.compile(spec["parameters"]["metrics"])
        self._matches: dict[str, bool] = {}
        super().__init__(spec, **kwargs)

    def waiting_for(self) -> str:
        return f"the first point of a metric matching {self.params['metrics']!r}"

    def wanted_metrics(self) -> list[str]:
        return [self.params["metrics"]]

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        if self.state == ALARM:
            return  # a diverged run does not recover
        matches = self._matches
        first_finite: tuple[int, Point] | None = None
        first_bad: tuple[int, Point] | None = None
        for (name, _rank), group in batch.groups.items():
            match = matches.get(name)
            if match is None:
                if len(matches) > 10000:
                    matches.clear()
                match = matches[name] = self._pattern.search(name) is not None
            if not match:
                continue
            if self.state == INSUFFICIENT_DATA:
                for position, value in enumerate(group.values):
                    if _isfinite(value):
                        if first_finite is None or group.indices[position] < first_finite[0]:
                            first_finite = (group.indices[position], group.points[position])
                        break
            # A sum is finite only if every value is; an overflowing sum of finite values falls through to the scan.
            if not _isfinite(group.total):
                for position, value in enumerate(group.values):
                    if not _isfinite(value):
                        if first_bad is None or group.indices[position] < first_bad[0]:
                            first_bad = (group.indices[position], group.points[position])
                        break
        if first_finite is not None and (first_bad is None or first_finite[0] < first_bad[0]):
            point = first_finite[1]
            self._move(out, OK, point.time, f"no NaN or infinite value in metrics matching {self.params['metrics']!r} "
                                            f"(first: {point.name} at step {point.step})",
                       {"metric": point.name, "value": point.value, "step": point.step, "rank": point.rank}, point.step)
        if first_bad is not None:
            point = first_bad[1]
            value = _as_float(point.value)
            self._move(out, ALARM, point.time, f"{point.name} was {_fmt(value)} at step {point.step} (rank {point.rank})",
                       {"metric": point.name, "value": value, "step": point.step, "rank": point.rank}, point.step)


class _LossNotDecreasing(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._history: deque[tuple[int, float]] = deque(maxlen=self.params["num_steps"] + 1)
        self._last_step: float = -_INF

    def waiting_for(self) -> str:
        warmup = self.params["warmup_steps"]
        return (f"{self.params['num_steps'] + 1} points of {self.params['metric']} (rank 0)"
                + (f" at or after step {warmup} (warm-up)" if warmup else ""))

    def wanted_metrics(self) -> list[str]:
        return [self.params["metric"]]

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        group = batch.groups.get((self.params["metric"], 0))
        if group is None:
            return
        history, last_step = self._history, self._last_step
        num_steps, diff_percent, warmup = self.params["num_steps"], self.params["diff_percent"], self.params["warmup_steps"]
        metric = self.params["metric"]
        for step, value, point in zip(group.steps, group.values, group.points, strict=True):
            if step <= last_step or step < warmup or not _isfinite(value):
                continue
            last_step = step
            history.append((step, value))
            if len(history) <= num_steps:
                continue
            old_step, old_value = history[0]
            decrease = _relative_change(value, old_value) * -100.0
            to_state = ALARM if decrease < diff_percent else OK
            if to_state != self.state:
                verdict = "less than" if to_state == ALARM else "at least"
                self._move(out, to_state, point.time,
                           f"{metric} changed by {_fmt(-decrease + 0.0)} % over the last {num_steps} points (steps {old_step} → "
                           f"{step}, {_fmt(old_value)} → {_fmt(value)}): a decrease {verdict} {_fmt(diff_percent)} %",
                           {"metric": metric, "step": step, "value": value, "previous_step": old_step,
                            "previous_value": old_value, "decrease_percent": decrease, "diff_percent": diff_percent}, step)
        self._last_step = last_step


class _Overfit(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._train: deque[tuple[int, float]] = deque(maxlen=1024)
        self._last_train_step: float = -_INF
        self._last_validation_step: float = -_INF
        self._consecutive = 0

    def waiting_for(self) -> str:
        return (f"a point of {self.params['validation_metric']} with a point of {self.params['train_metric']} at or "
                f"before its step (rank 0)")

    def wanted_metrics(self) -> list[str]:
        return [self.params["train_metric"], self.params["validation_metric"]]

    def _add_train(self, step: int, value: float) -> None:
        if step > self._last_train_step and _isfinite(value):
            self._last_train_step = step
            self._train.append((step, value))

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        train = batch.groups.get((self.params["train_metric"], 0))
        validation = batch.groups.get((self.params["validation_metric"], 0))
        train_steps = train.steps if train else []
        train_values = train.values if train else []
        train_indices = train.indices if train else []
        position = 0
        if validation is not None:
            for index, point, value in zip(validation.indices, validation.points, validation.values, strict=True):
                # Train points that arrived before this validation point, in stream order.
                while position < len(train_indices) and train_indices[position] < index:
                    self._add_train(train_steps[position], train_values[position])
                    position += 1
                self._on_validation(point, value, out)
        for step, value in zip(train_steps[position:], train_values[position:], strict=True):
            self._add_train(step, value)

    def _on_validation(self, point: Point, value: float, out: list[Transition]) -> None:
        step = point.step
        if step < self.params["start_step"] or step <= self._last_validation_step or not _isfinite(value):
            return
        matched = next(((s, v) for s, v in reversed(self._train) if s <= step), None)
        if matched is None or matched[1] == 0:
            return  # nothing to compare with yet (or a gap ratio over a zero loss is undefined)
        self._last_validation_step = step
        train_step, train_value = matched
        ratio = (value - train_value) / abs(train_value)
        threshold, patience = self.params["ratio_threshold"], self.params["patience"]
        self._consecutive = self._consecutive + 1 if ratio > threshold else 0
        to_state = ALARM if self._consecutive >= patience else OK
        train_metric, validation_metric = self.params["train_metric"], self.params["validation_metric"]
        if to_state == ALARM:
            reason = (f"{validation_metric} {_fmt(value)} is {_fmt(ratio * 100)} % above {train_metric} {_fmt(train_value)} "
                      f"at step {step} (ratio {_fmt(ratio)} > {_fmt(threshold)}, {self._consecutive} validation point(s) "
                      f"in a row; patience {patience})")
        else:
            reason = (f"{validation_metric} {_fmt(value)} vs {train_metric} {_fmt(train_value)} at step {step}: gap ratio "
                      f"{_fmt(ratio)}" + (f" ≤ {_fmt(threshold)}" if ratio <= threshold else
                                          f" > {_fmt(threshold)} for {self._consecutive} of {patience} validation point(s)"))
        self._move(out, to_state, point.time, reason,
                   {"train_metric": train_metric, "validation_metric": validation_metric, "train_value": train_value,
                    "train_step": train_step, "validation_value": value, "step": step, "ratio": ratio,
                    "ratio_threshold": threshold, "consecutive": self._consecutive, "patience": patience}, step)


class _Overtraining(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._best: float | None = None
        self._best_step: int | None = None
        self._not_improved: deque[bool] = deque(maxlen=self.params["window"])
        self._count = 0
        self._last_step: float = -_INF

    def wanted_metrics(self) -> list[str]:
        return [self.params["metric"]]

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        group = batch.groups.get((self.params["metric"], 0))
        if group is None:
            return
        metric, minimize, delta = self.params["metric"], self.params["mode"] == "min", self.params["delta"]
        patience, window = self.params["patience"], self.params["window"]
        for step, value, point in zip(group.steps, group.values, group.points, strict=True):
            if step <= self._last_step or not _isfinite(value):
                continue
            self._last_step = step
            best = self._best
            improved = best is None or (value < best - delta if minimize else value > best + delta)
            if improved:
                self._best, self._best_step = value, step
            if len(self._not_improved) == window:
                self._count -= self._not_improved[0]
            self._not_improved.append(not improved)
            self._count += not improved
            to_state = ALARM if self._count >= patience else OK
            if to_state != self.state:
                seen = len(self._not_improved)
                self._move(out, to_state, point.time,
                           f"{metric} not improving for {self._count} of the last {seen} evaluations (best "
                           f"{_fmt(self._best)} at step {self._best_step}; alarm at {patience} of {window})",
                           {"metric": metric, "value": value, "step": step, "best": self._best, "best_step": self._best_step,
                            "not_improving": self._count, "evaluations": seen, "patience": patience, "window": window,
                            "mode": self.params["mode"], "delta": delta}, step)


class _Stalled(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._last_activity = self.started_at

    def waiting_for(self) -> str:
        return f"the clock: ALARM after {_fmt(self.params['threshold_seconds'])} s without a metric point or log line"

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        self._on_activity(batch.max_time, out)

    def _on_activity(self, at: float, out: list[Transition]) -> None:
        if at > self._last_activity:
            self._last_activity = at
        if self.state != OK:
            self._move(out, OK, at, "a metric point or log line arrived", {"last_activity_at": self._last_activity}, None)

    def _on_tick(self, now: float, cost: float | None, projected_cost: float | None, first_step_at: float | None,
                 out: list[Transition]) -> None:
        silent, limit = now - self._last_activity, self.params["threshold_seconds"]
        values = {"last_activity_at": self._last_activity, "silent_seconds": silent, "threshold_seconds": limit}
        if silent > limit:
            self._move(out, ALARM, now, f"no metric or log line for {_fmt(round(silent))} s (limit {_fmt(limit)} s)", values, None)
        elif self.state == INSUFFICIENT_DATA:
            self._move(out, OK, now, f"last metric or log line {_fmt(round(silent))} s ago (limit {_fmt(limit)} s)", values, None)


class _MaxInitTime(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._first_step_at: float | None = None

    def waiting_for(self) -> str:
        return f"the first step (ALARM if none within {_fmt(self.params['threshold_seconds'])} s of the start)"

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        self._first_step(batch.min_time, out)

    def _first_step(self, at: float, out: list[Transition]) -> None:
        if self._first_step_at is not None and self._first_step_at <= at:
            return
        self._first_step_at = at
        took, limit = at - self.started_at, self.params["threshold_seconds"]
        values = {"started_at": self.started_at, "first_step_at": at, "init_seconds": took, "threshold_seconds": limit}
        if took <= limit:
            if self.state == INSUFFICIENT_DATA:
                self._move(out, OK, at, f"first step {_fmt(round(took))} s after the start (limit {_fmt(limit)} s)", values, None)
        else:
            self._move(out, ALARM, at, f"first step only {_fmt(round(took))} s after the start (limit {_fmt(limit)} s)",
                       values, None)

    def _on_tick(self, now: float, cost: float | None, projected_cost: float | None, first_step_at: float | None,
                 out: list[Transition]) -> None:
        if first_step_at is not None:
            self._first_step(float(first_step_at), out)
        if self._first_step_at is None:
            waited, limit = now - self.started_at, self.params["threshold_seconds"]
            if waited > limit:
                self._move(out, ALARM, now, f"no first step {_fmt(round(waited))} s after the start (limit {_fmt(limit)} s)",
                           {"started_at": self.started_at, "waited_seconds": waited, "threshold_seconds": limit}, None)


class _LowGpuUtilization(Evaluator):
    MIN_SAMPLES = 10

    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._samples: dict[tuple[str, int], deque[float]] = {}
        self._counts: dict[tuple[str, int], int] = {}
        self._low: dict[tuple[str, int], dict[str, Any]] = {}  # GPUs evaluated low now, with their figures
        self._evaluated: set[tuple[str, int]] = set()

    def waiting_for(self) -> str:
        return (f"{self.params['warmup_samples'] + self.MIN_SAMPLES} GPU utilization samples of a GPU "
                f"({self.params['warmup_samples']} of warm-up, then at least {self.MIN_SAMPLES})")

    def wanted_metrics(self) -> list[str]:
        return ["GPU utilization"]

    def _on_gpu(self, samples: Sequence[GpuSample], out: list[Transition]) -> None:
        window, warmup = self.params["window"], self.params["warmup_samples"]
        touched: dict[tuple[str, int], float] = {}
        for sample in samples:
            key = (sample.host, sample.gpu_index)
            count = self._counts.get(key, 0) + 1
            self._counts[key] = count
            if count <= warmup:
                continue
            utilization = _as_float(sample.utilization)
            if not _isfinite(utilization):
                continue
            series = self._samples.get(key)
            if series is None:
                series = self._samples[key] = deque(maxlen=window)
            series.append(utilization)
            touched[key] = max(touched.get(key, -_INF), sample.time)
        if not touched:
            return
        low95, low5 = self.params["threshold_p95"], self.params["threshold_p5"]
        last_ok: dict[str, Any] = {}
        for key in touched:
            series = self._samples[key]
            if len(series) < self.MIN_SAMPLES:
                continue
            ordered = sorted(series)
            p5, p95 = _percentile(ordered, 5.0), _percentile(ordered, 95.0)
            self._evaluated.add(key)
            if p95 < low95 or p5 < low5:
                self._low[key] = {"host": key[0], "gpu_index": key[1], "p5": p5, "p95": p95, "samples": len(series)}
            else:
                self._low.pop(key, None)
                last_ok = {"host": key[0], "gpu_index": key[1], "p5": p5, "p95": p95, "samples": len(series)}
        if not self._evaluated:
            return
        at = max(touched.values())
        thresholds = {"threshold_p95": low95, "threshold_p5": low5}
        if self._low:
            worst = self._low[min(self._low)]
            failing = (f"p95 {_fmt(worst['p95'])} % < {_fmt(low95)} %" if worst["p95"] < low95
                       else f"p5 {_fmt(worst['p5'])} % < {_fmt(low5)} %")
            others = f" ({len(self._low)} GPUs low)" if len(self._low) > 1 else ""
            self._move(out, ALARM, at, f"GPU {worst['gpu_index']} on {worst['host']}: {failing} utilization over the last "
                                       f"{worst['samples']} samples{others}",
                       {**worst, **thresholds, "low_gpus": [self._low[k] for k in sorted(self._low)][:SEEN_NAMES_LISTED]}, None)
        elif self.state != OK:
            self._move(out, OK, at, f"every GPU at p95 ≥ {_fmt(low95)} % and p5 ≥ {_fmt(low5)} % utilization "
                                    f"({len(self._evaluated)} GPUs)", {**last_ok, **thresholds}, None)


class _StepOutlier(Evaluator):
    # σ is floored at this share of the mean step time: a perfectly regular clock (σ 0)
    # must not make the first 0.1 % jitter an outlier.
    SIGMA_FLOOR = 0.01

    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._times: deque[float] = deque(maxlen=self.params["window"])
        self._sum = self._sum_squares = 0.0
        self._appended = 0
        self._previous: tuple[int, float] | None = None

    def waiting_for(self) -> str:
        return f"{self.params['min_steps'] + 2} points of {self.params['metric']} (rank 0) to measure step times"

    def wanted_metrics(self) -> list[str]:
        return [self.params["metric"]]

    def _add(self, seconds: float) -> None:
        times = self._times
        if len(times) == times.maxlen:
            old = times[0]
            self._sum -= old
            self._sum_squares -= old * old
        times.append(seconds)
        self._sum += seconds
        self._sum_squares += seconds * seconds
        self._appended += 1
        if self._appended >= len(times):  # recompute now and then so rounding does not drift
            self._appended = 0
            self._sum = math.fsum(times)
            self._sum_squares = math.fsum(t * t for t in times)

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        group = batch.groups.get((self.params["metric"], 0))
        if group is None:
            return
        k, min_steps, metric = self.params["stddev"], self.params["min_steps"], self.params["metric"]
        for step, time in zip(group.steps, group.times, strict=True):
            previous = self._previous
            self._previous = (step, time)
            if previous is None or step <= previous[0] or time < previous[1]:
                continue  # the first point, or a replay/out-of-order point: restart the step clock here
            seconds = (time - previous[1]) / (step - previous[0])
            n = len(self._times)
            if n >= min_steps:
                mean = self._sum / n
                sigma = math.sqrt(max(self._sum_squares / n - mean * mean, 0.0))
                limit = mean + k * max(sigma, self.SIGMA_FLOOR * mean)
                to_state = ALARM if seconds > limit else OK
                if to_state != self.state:
                    verdict = "more than" if to_state == ALARM else "within"
                    self._move(out, to_state, time,
                               f"a step of {metric} took {_fmt(seconds)} s (steps {previous[0]} → {step}), {verdict} mean "
                               f"{_fmt(mean)} s + {_fmt(k)}σ (σ {_fmt(sigma)} s) of the last {n} steps",
                               {"metric": metric, "step": step, "previous_step": previous[0], "step_seconds": seconds,
                                "mean": mean, "sigma": sigma, "limit": limit, "stddev": k, "steps": n}, step)
            self._add(seconds)


class _Budget(Evaluator):
    def waiting_for(self) -> str:
        return "the job's cost"

    def _on_tick(self, now: float, cost: float | None, projected_cost: float | None, first_step_at: float | None,
                 out: list[Transition]) -> None:
        limit, use_projection = self.params["limit"], self.params["projected"]
        cost = None if cost is None else _as_float(cost)
        projected = None if projected_cost is None else _as_float(projected_cost)
        cost = cost if cost is not None and _isfinite(cost) else None
        projected = projected if projected is not None and _isfinite(projected) else None
        if cost is None and (projected is None or not use_projection):
            return
        values = {"cost": cost, "projected_cost": projected, "limit": limit, "projected": use_projection}
        said = f"cost {_fmt_cost(cost)}" + (f", projected {_fmt_cost(projected)}" if projected is not None else "")
        over_actual = cost is not None and cost > limit
        over_projected = use_projection and projected is not None and projected > limit
        if over_actual or over_projected:
            which = "cost" if over_actual else "projected cost"
            self._move(out, ALARM, now, f"{which} passes the limit {_fmt_cost(limit)} ({said})", values, None)
        else:
            self._move(out, OK, now, f"within the limit {_fmt_cost(limit)} ({said})", values, None)


_COMPARE: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_BREACHING, _NOT_BREACHING, _MISSING = 1, 0, -1


class _Custom(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        p = self.params
        self._key = (p["metric"], p["rank"])
        self._window, self._warmup = p["window"], p["warmup_steps"]
        self._m, self._n = p["datapoints_to_alarm"], p["evaluation_periods"]
        self._previous_window = p["compare_to"] == "previous_window"
        self._nan_kind = {"missing": _MISSING, "breaching": _BREACHING, "notBreaching": _NOT_BREACHING}.get(
            p["treat_missing_data"])  # None: ignore
        self._compare = _COMPARE[p["comparison"]]
        self._statistic = _statistic(p["statistic"])
        self._periods: deque[tuple[int, float]] = deque(maxlen=p["evaluation_periods"])  # (kind, compared value)
        self._breaching = self._missing = 0
        self._buffer: list[float] = []
        self._previous: float | None = None  # the previous period's statistic (compare_to previous_window)
        self._last_step: float = -_INF
        self._last_data_at = self.started_at

    def wanted_metrics(self) -> list[str]:
        return [self.params["metric"]]

    def waiting_for(self) -> str:
        p = self.params
        return (f"{p['evaluation_periods']} period(s) of {p['window']} point(s) of {p['metric']} (rank {p['rank']}"
                + (f", from step {p['warmup_steps']}" if p["warmup_steps"] else "") + ")")

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        group = batch.groups.get(self._key)
        if group is None:
            return
        if group.max_time > self._last_data_at:
            self._last_data_at = group.max_time
        steps, values, times = group.steps, group.values, group.times
        last_step, warmup = self._last_step, self._warmup
        if not (steps[0] > last_step and steps[0] >= warmup and group.ordered()):
            # A replay, an out-of-order point or the warm-up in this batch: keep the new steps only.
            keep = []
            for position, step in enumerate(steps):
                if step > last_step and step >= warmup:
                    keep.append(position)
                    last_step = step
            if not keep:
                return
            steps, values, times = [steps[i] for i in keep], [values[i] for i in keep], [times[i] for i in keep]
        self._last_step = steps[-1]
        ends: list[int] | None = None  # where each period closes; None: every point closes one (window 1)
        statistics = values if self._window == 1 else self._close_periods(values, ends := [])
        offset = 0
        if self._previous_window and statistics:
            previous = self._previous
            if previous is None:  # the very first period only sets the base
                previous, statistics, offset = statistics[0], statistics[1:], 1
                if ends is not None:
                    ends, offset = ends[1:], 0
            changes = []
            for statistic in statistics:
                changes.append(_relative_change(statistic, previous))
                previous = statistic
            self._previous = previous
            statistics = changes
        if statistics:
            self._datapoints(statistics, steps, times, ends, offset, out, "")

    def _close_periods(self, values: list[float], ends: list[int]) -> list[float]:
        """The statistics of the periods `values` closes (with what the last batch left open)."""
        window, buffer, statistic = self._window, self._buffer, self._statistic
        position, need, statistics = 0, window - len(buffer), []
        while len(values) - position >= need:
            end = position + need
            chunk = buffer + values[position:end] if buffer else values[position:end]
            buffer = []
            if not _isfinite(sum(chunk)):
                chunk = [v for v in chunk if v == v]  # NaN values are dropped; ±Inf stay numbers
            statistics.append(statistic(chunk) if chunk else math.nan)
            ends.append(end - 1)
            position, need = end, window
        self._buffer = buffer + values[position:]
        return statistics

    def _datapoints(self, compared: list[float], steps: Sequence[int | None], times: Sequence[float],
                    ends: list[int] | None, offset: int, out: list[Transition], why: str) -> None:
        """Push datapoints (NaN: missing, per treat_missing_data) and move on "M of N"."""
        threshold, compare, nan_kind = self.params["threshold"], self._compare, self._nan_kind
        periods, m, n = self._periods, self._m, self._n
        if len(compared) > 1 and len(periods) == n and self.state != INSUFFICIENT_DATA and _isfinite(sum(compared)):
            # The usual batch: no NaN, and every datapoint on the side the state already is
            # (none breaching while OK, all breaching while ALARM), so the state cannot move.
            # A comparison with a threshold is monotone: the extremes decide for all.
            low, high = min(compared), max(compared)
            none_breach = not compare(low, threshold) and not compare(high, threshold)
            all_breach = compare(low, threshold) and compare(high, threshold)
            if (none_breach and self.state == OK) or (all_breach and self.state == ALARM):
                kind = _BREACHING if all_breach else _NOT_BREACHING
                periods.extend((kind, value) for value in compared[-n:])
                kinds = [k for k, _ in periods]
                self._breaching, self._missing = kinds.count(_BREACHING), kinds.count(_MISSING)
                return
        breaching, missing = self._breaching, self._missing
        for position, value in enumerate(compared):
            if value != value:
                if nan_kind is None:
                    continue
                kind = nan_kind
            else:
                kind = _BREACHING if compare(value, threshold) else _NOT_BREACHING
            if len(periods) == n:
                old = periods[0][0]
                if old == _BREACHING:
                    breaching -= 1
                elif old == _MISSING:
                    missing -= 1
            periods.append((kind, value))
            if kind == _BREACHING:
                breaching += 1
            elif kind == _MISSING:
                missing += 1
            if breaching >= m:
                to_state = ALARM
            elif len(periods) < n:
                continue  # fewer than N datapoints and not M breaching: too early to say OK
            elif missing == n:
                to_state = INSUFFICIENT_DATA
            else:
                to_state = OK
            if to_state != self.state:
                self._breaching, self._missing = breaching, missing
                at = ends[position] if ends is not None else position + offset
                self._report(to_state, value, steps[at], times[at], out, why)
        self._breaching, self._missing = breaching, missing

    def _report(self, to_state: str, compared: float, step: int | None, at: float, out: list[Transition], why: str) -> None:
        p, periods = self.params, self._periods
        m, n = self._m, self._n
        if compared != compared and not why:
            why = f"the {p['statistic']} of {p['metric']} had no value at step {step}"
        quantity = (f"the change of the {p['statistic']} of {p['metric']} from the previous window"
                    if self._previous_window else f"the {p['statistic']} of {p['metric']}")
        latest = why if compared != compared else f"latest {_fmt(compared)}" + (f" at step {step}" if step is not None else "")
        if to_state == INSUFFICIENT_DATA:
            reason = f"no datapoint in the last {n} period(s): {why or 'missing data'}"
        else:
            reason = (f"{self._breaching} of the last {len(periods)} datapoints breached ({m} of {n} alarm): {quantity} "
                      f"over {p['window']} point(s) {p['comparison']} {_fmt(p['threshold'])} ({latest})")
        self._move(out, to_state, at, reason,
                   {"metric": p["metric"], "statistic": p["statistic"], "comparison": p["comparison"],
                    "threshold": p["threshold"], "compare_to": p["compare_to"],
                    "datapoints": [None if k == _MISSING else v for k, v in periods],
                    "breaching": [k == _BREACHING for k, _ in periods], "datapoints_to_alarm": m,
                    "evaluation_periods": n}, step)

    def _on_tick(self, now: float, cost: float | None, projected_cost: float | None, first_step_at: float | None,
                 out: list[Transition]) -> None:
        every = self.params["missing_after_seconds"]
        silent = now - self._last_data_at
        if silent < every:
            return
        periods = int(silent // every)
        self._last_data_at += periods * every
        why = f"no point of {self.params['metric']} for {_fmt(round(silent))} s (a period is missing after {_fmt(every)} s)"
        count = min(periods, self._n)
        self._datapoints([math.nan] * count, [None] * count, [now] * count, None, 0, out, why)


_EVALUATORS: dict[str, type[Evaluator]] = {
    "non_finite": _NonFinite, "loss_not_decreasing": _LossNotDecreasing, "overfit": _Overfit,
    "overtraining": _Overtraining, "stalled": _Stalled, "max_init_time": _MaxInitTime,
    "low_gpu_utilization": _LowGpuUtilization, "step_outlier": _StepOutlier, "budget": _Budget, "custom": _Custom,
}


def evaluator(spec: dict, *, started_at: float, state: str = INSUFFICIENT_DATA,
              last_fired_at: float | None = None) -> Evaluator:
    """The evaluator of one rule (`spec`: check_rule's output) of a job started at
    `started_at` (unix seconds). `state` and `last_fired_at` restore a rule after a watcher
    restart: its history starts afresh, its state and cool-down carry on."""
    kind = _EVALUATORS.get(spec.get("type", ""))
    if kind is None:
        raise RuleError("type", f"must be one of {_listing(RULE_TYPES)}, not {_describe(spec.get('type'))}.")
    return kind(spec, started_at=started_at, state=state, last_fired_at=last_fired_at)


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
    return "unknown" if value is None else f"{value:.2f}"


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


__all__ = [
    "ACTION_TYPES", "ALARM", "BUILTIN_TYPES", "DEFAULT_RULES", "INSUFFICIENT_DATA", "OK", "RULE_TYPES", "Evaluator",
    "GpuSample", "Point", "RuleError", "Transition", "check_rule", "check_rules", "evaluator",
]
