"""How pages sum a job up: its metrics in reading order and the one final metric a row or a
choice shows."""

from __future__ import annotations

from typing import Any

from jobs.models import TrainingJob


def metric_sort_key(name: str) -> tuple[int, str]:
    """Losses first, then accuracies, then the rest: the charts people look at first."""
    lowered = name.lower()
    rank = 0 if "loss" in lowered else 1 if "acc" in lowered else 2
    return rank, lowered


def key_metric(job: TrainingJob) -> tuple[str, Any] | None:
    """The final metric a list row shows: the algorithm's objective when the job reported
    it, else the first validation metric, else the first one."""
    metrics = job.final_metrics or {}
    if not metrics:
        return None
    from algorithms import get_algorithm

    spec = get_algorithm(job.algorithm) if job.algorithm else None
    objective = spec.default_objective.get("metric") if spec else None
    if objective and objective in metrics:
        return objective, metrics[objective]
    for name in sorted(metrics, key=metric_sort_key):
        if name.startswith("validation"):
            return name, metrics[name]
    name = sorted(metrics, key=metric_sort_key)[0]
    return name, metrics[name]
