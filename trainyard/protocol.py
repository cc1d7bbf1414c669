"""Names shared by the studio and the processes it launches: Redis keys and environment
variables. Both sides import them from here, so they cannot drift apart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

# --- Redis streams, one set per job ---------------------------------------------------------
# Metric points, packed: one entry carries many points (one XADD per point tops out near
# 57k points/s). Fields: "r" rank, "p" JSON [[name, step, value, unix_time], ...] as
# json.dumps writes it, the points grouped by name (metric_payload).
METRICS_STREAM = "trainyard:job:{job_id}:metrics"
# Log lines. Fields: "r" rank, "t" unix time, "s" "out"|"err", "l" the line (capped length).
LOGS_STREAM = "trainyard:job:{job_id}:logs"
# Status transitions. Fields: "status", "at" ISO time, "message".
EVENTS_STREAM = "trainyard:job:{job_id}:events"
# System samples. Fields: "n" node name, "t" unix time, "cpu", "mem", "gpu", "gpu_mem" (JSON numbers or ""),
# "gpus" each GPU's utilisation % by index, comma-separated ("" without GPUs).
SYSTEM_STREAM = "trainyard:job:{job_id}:system"
# Streams whose jobs have points the flusher has not written yet (a set of job ids).
ACTIVE_METRIC_JOBS = "trainyard:metrics:active"
FLUSHER_GROUP = "flusher"

LOG_STREAM_MAXLEN = 20_000
EVENT_STREAM_MAXLEN = 1_000
SYSTEM_STREAM_MAXLEN = 10_000

# --- environment of a job process (beside SageMaker's SM_* and torch's RANK, ...) -------------
ENV_JOB_ID = "TRAINYARD_JOB_ID"
ENV_ATTEMPT = "TRAINYARD_ATTEMPT"
ENV_REDIS_URL = "TRAINYARD_REDIS_URL"
ENV_CHECKPOINT_EVERY_STEPS = "TRAINYARD_CHECKPOINT_EVERY_STEPS"
ENV_NODE_NAME = "TRAINYARD_NODE_NAME"
# The job's distribution as one JSON object (trainyard.env.read_distribution reads it):
# {"kind": "none" | "ddp" | "fsdp" | "pipeline"} plus, for "pipeline", its settings
# ("stages", "microbatches", "schedule", "partition", "memory_cap_mb", "ddp"). Runners before
# the object wrote the bare word ("ddp"); readers accept both.
ENV_DISTRIBUTION = "TRAINYARD_DISTRIBUTION"
# The job's `pipeline` settings alone, as JSON ({} unless the distribution is "pipeline").
ENV_PIPELINE = "TRAINYARD_PIPELINE"
# A folder where rank 0 writes <name>.json reports (trainyard.report); the studio shows
# them on the job's page and in the API (`details`).
ENV_REPORT_DIR = "TRAINYARD_REPORT_DIR"


def key(template: str, job_id: int) -> str:
    return template.format(job_id=job_id)


_name_of = itemgetter(0)


def metric_payload(points: Sequence[Sequence[Any]]) -> str:
    """One metrics entry's "p": the points as JSON, grouped by metric name (a stable sort:
    each name's points keep the order they were logged in, so the latest-sent of a repeated
    step still wins). A reader that wants one metric then decodes only the span between its
    first and last point (the rule watcher: jobs.rules.watcher.span_rows); ~35 ns a point
    here beside json.dumps's ~900."""
    return json.dumps(sorted(points, key=_name_of))
