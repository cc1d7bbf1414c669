"""How many records a job's validation figures are measured on (docs/SPEC.md §4).

A validation accuracy of 1 measured on one held-out row is no figure at all, so the job
page warns beside the metrics when the validation set has fewer than MIN_VALIDATION_RECORDS
records, and the API exposes the count.

- A job with a validation channel: the records staging gives that channel (the version's
  validation records, or the whole version when it has none — jobs.runner.staging).
- A built-in classifier without one: the seeded holdout of its train records,
  max(1, round(train × 10 %)) — the rule of algorithms.channels.holdout_split.
- Anything else (a script, char-lm's windows): unknown, None.
"""

from __future__ import annotations

from typing import TypedDict

from jobs.runner.staging import VersionFacts, plan_channel

MIN_VALIDATION_RECORDS = 30
# algorithms.channels.HOLDOUT_FRACTION (that module imports torch; the web does not).
HOLDOUT_FRACTION = 0.1
HOLDOUT_ALGORITHMS = frozenset({"tabular-classifier", "image-classifier", "text-classifier"})
VALIDATION_CHANNELS = ("validation", "valid", "val")


class ValidationRecords(TypedDict):
    count: int
    source: str  # "channel" | "held_out"
    few: bool  # fewer than MIN_VALIDATION_RECORDS


def channel_records(channel: str, version) -> int:
    """Records a job channel of this name reads from the version."""
    plan = plan_channel(channel, VersionFacts.of(version))
    if plan.channel is None:
        return int(version.num_records or 0)
    return int((version.channel_counts or {}).get(plan.channel, 0))


def validation_records(job) -> ValidationRecords | None:
    """The size of the job's validation set, or None when it cannot be known. Reads the
    job's inputs (prefetch `inputs__dataset_version__dataset` to keep it query-free)."""
    inputs = {i.channel.lower(): i for i in job.inputs.all()}
    for name in VALIDATION_CHANNELS:
        if name in inputs:
            count = channel_records(inputs[name].channel, inputs[name].dataset_version)
            return {"count": count, "source": "channel", "few": count < MIN_VALIDATION_RECORDS}
    if job.script_uri or job.algorithm not in HOLDOUT_ALGORITHMS or "train" not in inputs:
        return None
    train = channel_records(inputs["train"].channel, inputs["train"].dataset_version)
    if train < 2:
        return None
    held = max(1, int(round(train * HOLDOUT_FRACTION)))
    return {"count": held, "source": "held_out", "few": held < MIN_VALIDATION_RECORDS}
