"""Checking a rule's spec: `check_rule` fills in defaults and names a bad field,
`check_rules` checks a job spec's list and adds the default rules (jobs.rules.engine)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from jobs.patterns import compile_pattern
from jobs.patterns import error as PatternError
from jobs.rules.common import (
    ACTION_TYPES,
    COMPARISONS,
    MISSING_DATA_POLICIES,
    NAME_RE,
    RULE_KEYS,
    RULE_TYPES,
    STATES,
    TAG_MAX_CHARS,
    RuleError,
    _describe,
    _fmt,
    _isfinite,
    _listing,
)

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
            compile_pattern(value)  # the syntax the watcher matches with (jobs.patterns)
        except PatternError as exc:
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
        known = {"stop": ("type",), "notify": ("type", "channels", "on"), "tag": ("type", "tag")}[kind]
        unknown = [str(key) for key in item if key not in known]
        if unknown:
            raise RuleError(f"{path}.{unknown[0]}", f"is not a key of a {kind} action; its keys are {_listing(known)}.")
        action: dict[str, Any] = {"type": kind}
        if kind == "notify":
            action["channels"] = _check_channels(f"{path}.channels", item.get("channels"))
            if item.get("on") is not None:
                action["on"] = _check_notify_on(f"{path}.on", item["on"])
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


def _check_notify_on(path: str, raw: object) -> list[str]:
    """The states whose entry a notify action reports (CloudWatch's alarm, OK and
    insufficient-data actions); left out, every transition is sent."""
    if not isinstance(raw, list) or not raw:
        raise RuleError(path, f"must be a non-empty list of the states to notify on entering ({_listing(STATES)}; "
                              f"leave it out for every transition), not {_describe(raw)}.")
    for index, state in enumerate(raw):
        if state not in STATES or not isinstance(state, str):
            raise RuleError(f"{path}[{index}]", f"must be one of {_listing(STATES)}, not {_describe(state)}.")
        if state in raw[:index]:
            raise RuleError(f"{path}[{index}]", f"names {state} twice; list each state once.")
    return [state for state in STATES if state in raw]


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
    if "name" in changes and changes["name"] != existing.get("name") and "actions" not in changes:
        # A tag action that kept its default ("alarm:<rule name>") follows the new name.
        default = f"alarm:{existing.get('name')}"[:TAG_MAX_CHARS]
        for action in merged.get("actions") or []:
            if action.get("type") == "tag" and action.get("tag") == default:
                action.pop("tag")
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


