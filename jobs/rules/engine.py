"""The rule engine, Django-free: checking a rule's spec (`check_rule`, `check_rules`) and
evaluating it on one job's stream (`evaluator(spec, started_at=...)`), returning the state
transitions (OK, ALARM, INSUFFICIENT_DATA) the watcher stores and acts on.

This module is the engine's public face; the parts are jobs.rules.common (names, the error,
helpers), .spec (checking), .evaluation (points, batches, the Evaluator base), .builtins
(the catalogue's rules) and .custom (the "M of N" alarm).

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

from jobs.rules.builtins import (
    _Budget,
    _LossNotDecreasing,
    _LowGpuUtilization,
    _MaxInitTime,
    _NonFinite,
    _Overfit,
    _Overtraining,
    _Stalled,
    _StepOutlier,
)
from jobs.rules.common import (
    ACTION_TYPES,
    ALARM,
    BUILTIN_TYPES,
    COMPARISONS,
    INSUFFICIENT_DATA,
    MISSING_DATA_POLICIES,
    NAME_RE,
    OK,
    RULE_KEYS,
    RULE_TYPES,
    STATES,
    STATISTICS,
    RuleError,
    _describe,
    _listing,
)
from jobs.rules.custom import _Custom
from jobs.rules.evaluation import Evaluator, GpuSample, Point, PointColumns, Transition
from jobs.rules.spec import DEFAULT_RULES, check_rule, check_rules

_EVALUATORS: dict[str, type[Evaluator]] = {
    "non_finite": _NonFinite, "loss_not_decreasing": _LossNotDecreasing, "overfit": _Overfit,
    "overtraining": _Overtraining, "stalled": _Stalled, "max_init_time": _MaxInitTime,
    "low_gpu_utilization": _LowGpuUtilization, "step_outlier": _StepOutlier, "budget": _Budget, "custom": _Custom,
}


def evaluator(spec: dict, *, started_at: float, state: str = INSUFFICIENT_DATA,
              last_fired_at: float | None = None, had_data: bool | None = None) -> Evaluator:
    """The evaluator of one rule (`spec`: check_rule's output) of a job started at
    `started_at` (unix seconds). `state` and `last_fired_at` restore a rule after a watcher
    restart: its history starts afresh, its state and cool-down carry on, and `had_data`
    whether it ever left INSUFFICIENT_DATA (by default: whether `state` is another)."""
    kind = _EVALUATORS.get(spec.get("type", ""))
    if kind is None:
        raise RuleError("type", f"must be one of {_listing(RULE_TYPES)}, not {_describe(spec.get('type'))}.")
    return kind(spec, started_at=started_at, state=state, last_fired_at=last_fired_at, had_data=had_data)


__all__ = [
    "ACTION_TYPES", "ALARM", "BUILTIN_TYPES", "COMPARISONS", "DEFAULT_RULES", "INSUFFICIENT_DATA", "MISSING_DATA_POLICIES",
    "NAME_RE", "OK", "RULE_KEYS", "RULE_TYPES", "STATES", "STATISTICS", "Evaluator", "GpuSample", "Point", "PointColumns", "RuleError",
    "Transition", "check_rule", "check_rules", "evaluator",
]

