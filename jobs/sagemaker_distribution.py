"""A job's `distribution` as submissions give it: our word ("none" | "ddp" | "fsdp" |
"pipeline"), or a SageMaker estimator's `distribution` object, mapped onto the word, the
`pipeline` settings and `resources.processes_per_node`, so an estimator's config carries over
and makes the same job (docs/SPEC.md §3.1):

    {"torch_distributed": {"enabled": true}}                    → "ddp"
    {"pytorchddp": {"enabled": true}}                           → "ddp"
    {"smdistributed": {"dataparallel": {"enabled": true}}}      → "ddp"
    {"smdistributed": {"modelparallel": {"enabled": true, "parameters": {"partitions": 2,
        "microbatches": 4, "pipeline": "interleaved", "ddp": true}}}}
        → "pipeline" with {"stages": 2, "microbatches": 4, "schedule": "1f1b", "ddp": true}
    {"mpi": {"enabled": true, "processes_per_host": 2}}         → "ddp", 2 processes per node

A section whose `enabled` is false maps to nothing ("none" when nothing is enabled). Every key
is checked: an unknown one is a 400 on `distribution` naming its dotted path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import Distribution

# smdistributed.modelparallel's `pipeline` → our schedule: SageMaker's "interleaved" runs a
# backward as soon as its microbatch's forward is done (1F1B); "simple" runs every forward first.
SAGEMAKER_SCHEDULES = {"interleaved": "1f1b", "simple": "gpipe"}
# What smdistributed.modelparallel assumes when a config leaves them out.
SAGEMAKER_MICROBATCHES = 1
SAGEMAKER_PIPELINE = "interleaved"
MODELPARALLEL = "smdistributed.modelparallel"
MODELPARALLEL_PARAMETERS = ("partitions", "microbatches", "pipeline", "ddp")
# Our pipeline setting → the modelparallel parameter it comes from, for messages.
PARAMETER_OF_SETTING = {"stages": "partitions", "microbatches": "microbatches", "schedule": "pipeline", "ddp": "ddp"}
TOP_LEVEL_KEYS = ("torch_distributed", "pytorchddp", "smdistributed", "mpi")
WORDS = tuple(str(value) for value in Distribution.values)


@dataclass(frozen=True)
class SageMakerDistribution:
    """A SageMaker `distribution` object, mapped: what JobCreateSerializer.validate puts in
    the submission's `distribution`, `pipeline` and `resources.processes_per_node`."""

    kind: str  # one of Distribution's words
    pipeline: dict[str, Any] | None = None  # validated by PipelineSerializer, for "pipeline"
    processes_per_node: int | None = None  # mpi.processes_per_host


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _section(value: Any, path: str, known: tuple[str, ...]) -> dict[str, Any]:
    """`value` as the object at `path`, whose keys must all be `known`."""
    if not isinstance(value, dict):
        example = 'an object such as {"enabled": true}' if "enabled" in known else f"an object of {', '.join(known)}"
        raise serializers.ValidationError(f"{path} must be {example}, got {_shown(value)}.")
    for key in value:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise serializers.ValidationError(f"Unknown key '{where}'; known: {', '.join(known)}.")
    return value


def _enabled(section: dict[str, Any], path: str) -> bool:
    if "enabled" not in section:
        raise serializers.ValidationError(f"{path}.enabled is required: true or false.")
    enabled = section["enabled"]
    if not isinstance(enabled, bool):
        raise serializers.ValidationError(f"{path}.enabled must be true or false, got {_shown(enabled)}.")
    return enabled


def _whole(section: dict[str, Any], name: str, path: str, minimum: int, maximum: int, meaning: str) -> int:
    value = section[name]
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise serializers.ValidationError(
            f"{path}.{name} must be a whole number from {minimum} to {maximum} ({meaning}), got {_shown(value)}.")
    return value


def _pipeline(parameters: dict[str, Any]) -> dict[str, Any]:
    """smdistributed.modelparallel's parameters as our `pipeline` settings, validated by
    the same serializer as a submission's own `pipeline` (so both store alike)."""
    from jobs.serializers import PipelineSerializer

    path = f"{MODELPARALLEL}.parameters"
    if "partitions" not in parameters:
        raise serializers.ValidationError(f"{path}.partitions is required: the number of pipeline stages (2 or more).")
    stages = _whole(parameters, "partitions", path, 2, 64, "one pipeline stage per partition; for 1, use pytorchddp")
    microbatches = _whole({"microbatches": SAGEMAKER_MICROBATCHES, **parameters}, "microbatches", path, 1, 1024,
                          "each batch is split into this many")
    pipeline = parameters.get("pipeline", SAGEMAKER_PIPELINE)
    if pipeline not in SAGEMAKER_SCHEDULES:
        raise serializers.ValidationError(
            f'{path}.pipeline must be "interleaved" (the 1f1b schedule) or "simple" (gpipe), got {_shown(pipeline)}.')
    ddp = parameters.get("ddp", False)
    if not isinstance(ddp, bool):
        raise serializers.ValidationError(f"{path}.ddp must be true or false, got {_shown(ddp)}.")
    settings = PipelineSerializer(data={"stages": stages, "microbatches": microbatches,
                                        "schedule": SAGEMAKER_SCHEDULES[pipeline], "ddp": ddp})
    if not settings.is_valid():
        name, messages = next(iter(settings.errors.items()))
        raise serializers.ValidationError(f"{path}.{PARAMETER_OF_SETTING.get(name, name)}: {messages[0]}")
    return dict(settings.validated_data)


def from_sagemaker(value: dict[str, Any]) -> SageMakerDistribution:
    """1. Check every section's keys and `enabled`, even in sections that are not enabled
       (their other values are ignored, as SageMaker ignores them).
    2. At most one strategy may be enabled (mpi is the launcher, and combines with any).
    3. modelparallel → "pipeline" with its parameters; any other strategy, or mpi alone, → "ddp"."""
    _section(value, "", TOP_LEVEL_KEYS)
    enabled: list[str] = []
    pipeline: dict[str, Any] | None = None
    for name in ("torch_distributed", "pytorchddp"):
        if name in value and _enabled(_section(value[name], name, ("enabled",)), name):
            enabled.append(name)
    if "smdistributed" in value:
        smdistributed = _section(value["smdistributed"], "smdistributed", ("dataparallel", "modelparallel"))
        if "dataparallel" in smdistributed:
            path = "smdistributed.dataparallel"
            if _enabled(_section(smdistributed["dataparallel"], path, ("enabled",)), path):
                enabled.append(path)
        if "modelparallel" in smdistributed:
            modelparallel = _section(smdistributed["modelparallel"], MODELPARALLEL, ("enabled", "parameters"))
            parameters = _section(modelparallel.get("parameters", {}), f"{MODELPARALLEL}.parameters",
                                  MODELPARALLEL_PARAMETERS)
            if _enabled(modelparallel, MODELPARALLEL):
                enabled.append(MODELPARALLEL)
                pipeline = _pipeline(parameters)
    processes_per_node = None
    mpi_enabled = False
    if "mpi" in value:
        mpi = _section(value["mpi"], "mpi", ("enabled", "processes_per_host"))
        mpi_enabled = _enabled(mpi, "mpi")
        if mpi_enabled and "processes_per_host" in mpi:
            processes_per_node = _whole(mpi, "processes_per_host", "mpi", 1, 256, "processes on each node")
    if len(enabled) > 1:
        raise serializers.ValidationError(
            f"{enabled[0]} and {enabled[1]} are both enabled; enable one (for data parallel across pipeline "
            f"replicas, set {MODELPARALLEL}.parameters.ddp).")
    if pipeline is not None:
        kind = Distribution.PIPELINE
    elif enabled or mpi_enabled:
        kind = Distribution.DDP
    else:
        kind = Distribution.NONE
    return SageMakerDistribution(kind=str(kind), pipeline=pipeline, processes_per_node=processes_per_node)


_ENABLED = {"type": "object", "properties": {"enabled": {"type": "boolean"}}, "required": ["enabled"],
            "additionalProperties": False}
SAGEMAKER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "SageMaker distribution",
    "description": "A SageMaker estimator's `distribution`, mapped: torch_distributed, pytorchddp and "
                   "smdistributed.dataparallel → ddp; smdistributed.modelparallel → pipeline (partitions → stages, "
                   "pipeline interleaved → 1f1b, simple → gpipe); mpi.processes_per_host → "
                   "resources.processes_per_node. Unknown keys are refused.",
    "properties": {
        "torch_distributed": _ENABLED,
        "pytorchddp": _ENABLED,
        "smdistributed": {"type": "object", "additionalProperties": False, "properties": {
            "dataparallel": _ENABLED,
            "modelparallel": {"type": "object", "required": ["enabled"], "additionalProperties": False, "properties": {
                "enabled": {"type": "boolean"},
                "parameters": {"type": "object", "additionalProperties": False, "properties": {
                    "partitions": {"type": "integer", "minimum": 2, "maximum": 64},
                    "microbatches": {"type": "integer", "minimum": 1, "maximum": 1024},
                    "pipeline": {"type": "string", "enum": list(SAGEMAKER_SCHEDULES)},
                    "ddp": {"type": "boolean"},
                }},
            }},
        }},
        "mpi": {"type": "object", "required": ["enabled"], "additionalProperties": False, "properties": {
            "enabled": {"type": "boolean"},
            "processes_per_host": {"type": "integer", "minimum": 1, "maximum": 256},
        }},
    },
    "additionalProperties": False,
}


@extend_schema_field({
    "oneOf": [{"type": "string", "enum": list(WORDS)}, SAGEMAKER_SCHEMA],
    "default": str(Distribution.NONE),
    "description": 'The distribution: "none", "ddp", "fsdp" or "pipeline" (with `pipeline`), or a SageMaker '
                   "estimator's `distribution` object. The job stores the word.",
})
class DistributionField(serializers.ChoiceField):
    """Our word (ChoiceField's own checks and messages), or a SageMaker object, which
    becomes a SageMakerDistribution for JobCreateSerializer.validate to apply."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            return from_sagemaker(data)
        if not isinstance(data, str):
            raise serializers.ValidationError(
                f"Use one of {', '.join(json.dumps(word) for word in WORDS)}, or a SageMaker distribution object such as "
                f'{{"torch_distributed": {{"enabled": true}}}}; got {_shown(data)}.')
        return super().to_internal_value(data)
