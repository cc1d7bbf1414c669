"""The built-in rules after the managed service's catalogue (jobs.rules.engine)."""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from jobs.patterns import PatternTimeout, compile_pattern
from jobs.rules.common import (
    _INF,
    ALARM,
    INSUFFICIENT_DATA,
    OK,
    SEEN_NAMES_LISTED,
    _fmt,
    _fmt_cost,
    _isfinite,
    _percentile,
    _relative_change,
)
from jobs.rules.evaluation import Evaluator, GpuSample, Point, Transition, _as_float, _Batch


class _NonFinite(Evaluator):
    def __init__(self, spec: dict, **kwargs: Any) -> None:
        self._pattern = compile_pattern(spec["parameters"]["metrics"])  # a user's pattern: jobs.patterns
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
                try:
                    match = self._pattern.search(name) is not None
                except PatternTimeout:  # a pattern that backtracks without end decides nothing: not watched
                    match = False
                matches[name] = match
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
    """The managed service's rule: every `num_steps` steps, the loss now against the loss
    `num_steps` steps earlier (the newest point at or before that step). Checked once per
    `num_steps` steps, not at every point: comparing each noisy point with one
    `num_steps` back flips between OK and ALARM at every other point."""

    def __init__(self, spec: dict, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self._history: deque[tuple[int, float]] = deque()
        self._last_step: float = -_INF
        self._next_check: float = -_INF

    def waiting_for(self) -> str:
        warmup = self.params["warmup_steps"]
        return (f"{self.params['metric']} (rank 0) over {self.params['num_steps']} steps"
                + (f" at or after step {warmup} (warm-up)" if warmup else ""))

    def wanted_metrics(self) -> list[str]:
        return [self.params["metric"]]

    def _on_points(self, batch: _Batch, out: list[Transition]) -> None:
        group = batch.groups.get((self.params["metric"], 0))
        if group is None:
            return
        history, last_step, next_check = self._history, self._last_step, self._next_check
        num_steps, diff_percent, warmup = self.params["num_steps"], self.params["diff_percent"], self.params["warmup_steps"]
        metric = self.params["metric"]
        for step, value, point in zip(group.steps, group.values, group.points, strict=True):
            if step <= last_step or step < warmup or not _isfinite(value):
                continue
            last_step = step
            history.append((step, value))
            # Keep one point at or before step - num_steps: the one to compare with.
            while len(history) > 2 and history[1][0] <= step - num_steps:
                history.popleft()
            old_step, old_value = history[0]
            if step - old_step < num_steps or step < next_check:
                continue
            next_check = step + num_steps
            decrease = _relative_change(value, old_value) * -100.0
            to_state = ALARM if decrease < diff_percent else OK
            if to_state != self.state:
                verdict = "less than" if to_state == ALARM else "at least"
                self._move(out, to_state, point.time,
                           f"{metric} changed by {_fmt(-decrease + 0.0)} % over {step - old_step} steps ({old_step} → "
                           f"{step}, {_fmt(old_value)} → {_fmt(value)}): a decrease {verdict} {_fmt(diff_percent)} %",
                           {"metric": metric, "step": step, "value": value, "previous_step": old_step,
                            "previous_value": old_value, "decrease_percent": decrease, "diff_percent": diff_percent}, step)
        self._last_step, self._next_check = last_step, next_check


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

    def _resume(self, at: float) -> None:
        if at > self._last_activity:
            self._last_activity = at

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

    def _resume(self, at: float) -> None:
        # OK or ALARM: decided while another watcher watched (the first step came, or came
        # late, or never came in time); the steps this one sees are not the first.
        if self.state != INSUFFICIENT_DATA and self._first_step_at is None:
            self._first_step_at = self.started_at

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


