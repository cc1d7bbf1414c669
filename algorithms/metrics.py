"""How a built-in algorithm reports its metrics: one `step=120 train_loss=0.3124` line on
stdout (what metric_definitions match) and the same points through the SDK."""

from __future__ import annotations

import sys

from trainyard import flush as flush_metrics
from trainyard import log_metrics as sdk_log_metrics
from trainyard.parallel.processes import emit


def format_value(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    return f"{value:.6g}"


class MetricLogger:
    """Prints `step=120 train_loss=0.3124 ...` (one line, flushed, for metric_definitions)
    and hands the same points to trainyard.log_metrics, which never blocks or raises."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        emit(f"step={step} " + " ".join(f"{name}={format_value(value)}" for name, value in metrics.items()))
        # The SDK never raises (a Redis outage is its problem to buffer); the points it
        # sends and the stdout line carry the same (name, step, rank), so a runner that
        # also applies metric_definitions to this line stores each point once.
        sdk_log_metrics(metrics, step)

    def close(self) -> None:
        """Wait (a bounded while) for the SDK to hand every point to Redis: the runner
        reads final metrics soon after the process exits."""
        if not flush_metrics(5.0):
            emit("warning: some metric points were not sent before the end of training", sys.stderr)
