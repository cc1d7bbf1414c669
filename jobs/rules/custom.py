"""The custom rule: a cloud-monitoring alarm on any metric ("M of N" periods of a window
statistic against a threshold or the previous window), with missing-data policies
(jobs.rules.engine)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from jobs.rules.builtins import _BREACHING, _COMPARE, _MISSING, _NOT_BREACHING
from jobs.rules.common import _INF, ALARM, INSUFFICIENT_DATA, OK, _fmt, _isfinite, _relative_change, _statistic
from jobs.rules.evaluation import Evaluator, Transition, _Batch


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
        self._statistic_name = p["statistic"]
        self._periods: deque[tuple[int, float]] = deque(maxlen=p["evaluation_periods"])  # (kind, compared value)
        self._breaching = self._missing = 0
        self._buffer: list[float] = []
        self._previous: float | None = None  # the previous period's statistic (compare_to previous_window)
        self._last_step: float = -_INF
        self._last_data_at = self.started_at

    def _resume(self, at: float) -> None:
        if at > self._last_data_at:  # missing data is counted from here, not from the job's start
            self._last_data_at = at

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
        """The statistics of the periods `values` closes (with what the last batch left open).
        The full windows are cut with one comprehension and summed with map; a batch whose
        sums are all finite (no NaN, no ±Inf) takes the mean or sum from those sums."""
        window, buffer = self._window, self._buffer
        position = 0
        statistics: list[float] = []
        if buffer:
            need = window - len(buffer)
            if len(values) < need:
                self._buffer = buffer + values
                return statistics
            statistics.append(self._period(buffer + values[:need]))
            ends.append(need - 1)
            position = need
        full = (len(values) - position) // window
        if full:
            stop = position + full * window
            chunks = [values[i:i + window] for i in range(position, stop, window)]
            sums = list(map(sum, chunks))
            if not _isfinite(sum(sums)):
                statistics.extend(map(self._period, chunks))
            elif self._statistic_name == "mean":
                statistics.extend([total / window for total in sums])
            elif self._statistic_name == "sum":
                statistics.extend(map(float, sums))
            else:
                statistics.extend(map(self._statistic, chunks))
            ends.extend(range(position + window - 1, stop, window))
            position = stop
        self._buffer = values[position:]
        return statistics

    def _period(self, chunk: list[float]) -> float:
        """One window's statistic: NaN values are dropped; ±Inf stay numbers."""
        if not _isfinite(sum(chunk)):
            chunk = [v for v in chunk if v == v]
        return self._statistic(chunk) if chunk else math.nan

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


