"""What every evaluator shares: the point, GPU sample and transition types, a batch
grouped by (metric, rank) once for all of a job's rules, and the Evaluator base class
(jobs.rules.engine)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

from jobs.rules.common import _INF, ALARM, INSUFFICIENT_DATA, SEEN_NAMES_LISTED, STATES, _isfinite, _json_safe, _listing

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


class PointColumns(Sequence[Point]):
    """One metric's points on one rank as columns — the watcher's fast path: its parser
    makes the columns straight from the stream entries and the evaluators read them as
    they are; a Point object is made only when one is asked for (a transition's, say).
    Treat it as immutable once handed to a rule, like any batch."""

    __slots__ = ("name", "rank", "steps", "values", "times")

    def __init__(self, name: str, rank: int, steps: list[int], values: list[float], times: list[float]) -> None:
        self.name, self.rank, self.steps, self.values, self.times = name, rank, steps, values, times

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, index):  # type: ignore[override]  # noqa: ANN001, ANN204 - int or slice, as a list takes
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return Point(self.name, self.steps[index], self.values[index], self.times[index], self.rank)

    def __iter__(self) -> Iterator[Point]:
        return map(Point, repeat(self.name), self.steps, self.values, self.times, repeat(self.rank))


class _Batch:
    __slots__ = ("source", "length", "first", "last", "groups", "min_time", "max_time")

    def __init__(self, points: Sequence[Point]) -> None:
        self.source = points
        self.length = len(points)
        self.first, self.last = points[0], points[-1]
        groups = _columns_group(points) if isinstance(points, PointColumns) else _grouped(points)
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


def _columns_group(columns: PointColumns) -> dict[tuple[str, int], _Group]:
    group = _Group()
    group.points, group.indices = columns, range(len(columns))  # type: ignore[assignment]
    group.values, group.steps, group.times = columns.values, columns.steps, columns.times
    return {(columns.name, columns.rank): group}


_last_batch: _Batch | None = None


def _batch_of(points: Sequence[Point]) -> _Batch:
    """The grouping of `points`, shared by every rule the watcher hands the same batch."""
    global _last_batch
    batch = _last_batch
    # The same list object refilled in place (a reused buffer) holds new Point objects: compare its ends too.
    if batch is not None and batch.source is points and isinstance(points, PointColumns):
        return batch  # immutable columns: their own identity says it all
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
                 last_fired_at: float | None = None, had_data: bool | None = None) -> None:
        self.spec = spec
        self.params: dict[str, Any] = spec["parameters"]
        self.enabled = bool(spec.get("enabled", True))
        self.started_at = float(started_at)
        self.state = state if state in STATES else INSUFFICIENT_DATA
        self.cooldown_seconds = float(self.params.get("cooldown_seconds", 0.0))
        self.last_fired_at = last_fired_at
        self.finished = False
        # Whether the rule ever left INSUFFICIENT_DATA (a metric that went missing after points
        # came is not "never got data"); a restored rule says so itself (`had_data`).
        self.had_data = self.state != INSUFFICIENT_DATA if had_data is None else bool(had_data)
        self._pending: list[Transition] = []
        self._seen: dict[str, None] = {}
        waiting = self.waiting_for()
        self.reason = (f"waiting for {waiting}" if self.state == INSUFFICIENT_DATA
                       else f"{self.state} when the watcher restarted; evaluating again from new data ({waiting})")

    # The public calls. Subclasses implement the _on_* hooks they need.

    def observe(self, points: Sequence[Point]) -> list[Transition]:
        out = self._take_pending()
        if not isinstance(points, list | tuple | PointColumns):
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
            if self.state == INSUFFICIENT_DATA and not self.had_data:
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

    def warm(self, points: Sequence[Point]) -> None:
        """Points an earlier watcher already judged (the stream's acked entries, read again
        after a restart): they refill the windows, and nothing else changes — no transition
        comes of them, and the state, its reason, the cool-down and `had_data` stay."""
        if not points:
            return
        pending, self._pending = self._pending, []
        kept = (self.state, self.reason, self.last_fired_at, self.had_data)
        try:
            self.observe(points)
        finally:
            self._pending = pending
            self.state, self.reason, self.last_fired_at, self.had_data = kept

    def resume(self, at: float) -> None:
        """The watcher takes up a job already running (after its own restart, a change of
        leader, or for a rule added while the job runs): the clock-driven timers start at
        `at`, the newest activity it knows of, not at the job's start, or a job two hours
        in would read as two hours of silence (`stalled`, a custom rule's missing data) and a
        first step long since decided as never come (`max_init_time`)."""
        at = float(at)
        if _isfinite(at):
            self._resume(at)

    def _resume(self, at: float) -> None:
        pass

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
        self.had_data = self.had_data or to_state != INSUFFICIENT_DATA


