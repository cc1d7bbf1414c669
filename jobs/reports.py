"""What a job's training processes reported about themselves (`TrainingJob.details`), read
for the job's page: the pipeline partition (`details["partition"]`) and FSDP's settings
(`details["fsdp"]`).

The reports are JSON written by user code (trainyard.report), so every reader here takes
what it can use and drops the rest: a malformed report shows less, never a server error."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

MAX_STAGES = 256
MAX_NOTES = 50
NAMES_SHOWN = 4  # layer names listed per stage before "… and N more"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _share(value: float | None, largest: float | None) -> int:
    """A bar's width: percent of the largest value of its column."""
    if value is None or not largest or largest <= 0:
        return 0
    return max(1, min(100, round(100 * value / largest)))


@dataclass(frozen=True)
class StageRow:
    stage: int
    first_layer: int | None
    last_layer: int | None
    layer_names: list[str]
    predicted_ms: float | None
    measured_ms: float | None
    memory_mb: float | None
    peak_memory_mb: float | None  # measured: the stage's process (replica 0's) at its peak
    over_cap: bool
    predicted_bar: int  # percent of the slowest stage (for the inline bars)
    measured_bar: int
    slowest: bool  # sets the pipeline's pace: by measured time when there is one, else predicted

    @property
    def layer_count(self) -> int | None:
        if self.first_layer is None or self.last_layer is None:
            return None
        return self.last_layer - self.first_layer + 1

    @property
    def names_shown(self) -> list[str]:
        return self.layer_names[:NAMES_SHOWN]

    @property
    def names_hidden(self) -> int:
        return max(0, len(self.layer_names) - NAMES_SHOWN)


@dataclass(frozen=True)
class PartitionReport:
    mode: str
    schedule: str
    stages: int
    microbatches: int | None
    memory_cap_mb: float | None
    balance_predicted: float | None
    balance_measured: float | None
    layer_total: int
    rows: list[StageRow]
    notes: list[str] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return any(row.measured_ms is not None for row in self.rows)


def partition_report(details: Any) -> PartitionReport | None:
    """details["partition"] as one row per stage, or None when the job has none."""
    report = details.get("partition") if isinstance(details, dict) else None
    if not isinstance(report, dict):
        return None
    layers = [_text(name) for name in _list(report.get("layers"))]
    ranges = _list(report.get("stage_layers"))[:MAX_STAGES]
    predicted = [_number(v) for v in _list(report.get("predicted_ms"))]
    measured = [_number(v) for v in _list(report.get("measured_ms"))]
    memory = [_number(v) for v in _list(report.get("memory_mb"))]
    peaks = [_number(v) for v in _list(report.get("memory_per_rank_mb"))]  # by rank: replica 0's ranks come first
    cap = _number(report.get("memory_cap_mb"))
    count = _integer(report.get("stages")) or 0
    count = min(MAX_STAGES, max(count, len(ranges), len(predicted), len(measured), len(memory)))

    def at(values: list, index: int) -> Any:
        return values[index] if index < len(values) else None

    largest_predicted = max((v for v in predicted if v is not None), default=None)
    largest_measured = max((v for v in measured if v is not None), default=None)
    pace = measured if largest_measured is not None else predicted
    pace_max = largest_measured if largest_measured is not None else largest_predicted
    rows = []
    for index in range(count):
        bounds = at(ranges, index)
        first = last = None
        if isinstance(bounds, list) and len(bounds) == 2:
            first, last = _integer(bounds[0]), _integer(bounds[1])
            if first is None or last is None or first > last or first < 0:
                first = last = None
        names = layers[first:last + 1] if first is not None and last is not None else []
        stage_memory = at(memory, index)
        rows.append(StageRow(
            stage=index, first_layer=first, last_layer=last, layer_names=names,
            predicted_ms=at(predicted, index), measured_ms=at(measured, index), memory_mb=stage_memory,
            peak_memory_mb=at(peaks, index),
            over_cap=cap is not None and stage_memory is not None and stage_memory > cap,
            predicted_bar=_share(at(predicted, index), largest_predicted),
            measured_bar=_share(at(measured, index), largest_measured),
            slowest=pace_max is not None and count > 1 and at(pace, index) == pace_max,
        ))
    return PartitionReport(
        mode=_text(report.get("mode")), schedule=_text(report.get("schedule")), stages=count,
        microbatches=_integer(report.get("microbatches")), memory_cap_mb=cap,
        balance_predicted=_number(report.get("balance_predicted")), balance_measured=_number(report.get("balance_measured")),
        layer_total=len(layers), rows=rows, notes=[_text(note) for note in _list(report.get("notes"))[:MAX_NOTES]],
    )


@dataclass(frozen=True)
class FsdpReport:
    sharding: str
    backend: str
    fallbacks: list[str]
    other: list[tuple[str, str]]  # anything else the process reported, as text


FSDP_KNOWN = ("sharding", "backend", "fallbacks")


def fsdp_report(details: Any) -> FsdpReport | None:
    report = details.get("fsdp") if isinstance(details, dict) else None
    if not isinstance(report, dict):
        return None
    return FsdpReport(
        sharding=_text(report.get("sharding")), backend=_text(report.get("backend")),
        fallbacks=[_text(item) for item in _list(report.get("fallbacks"))[:MAX_NOTES]],
        other=[(str(key), _text(value)) for key, value in sorted(report.items()) if key not in FSDP_KNOWN][:MAX_NOTES],
    )
