"""The environment a training process is launched into (docs/SPEC.md §3.4): SageMaker's training-
toolkit variables, torch.distributed's, and Trainyard's own, read into one dataclass.

Defaults are SageMaker's container paths, so a script written for SageMaker reads the
same places here; nothing in this module imports Django or torch.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard import protocol
from trainyard.errors import DataError

SAGEMAKER_BASE = "/opt/ml"
_CHANNEL_PREFIX = "SM_CHANNEL_"
DISTRIBUTION_KINDS = ("none", "ddp", "fsdp", "pipeline")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
# A pipeline's settings in TRAINYARD_DISTRIBUTION's order, with the API's defaults for those
# a job may leave out (jobs.serializers.PipelineSerializer).
PIPELINE_SETTINGS = ("stages", "microbatches", "schedule", "partition", "memory_cap_mb", "ddp")
PIPELINE_DEFAULTS: dict[str, Any] = {"microbatches": 4, "schedule": "gpipe", "partition": "auto", "memory_cap_mb": None,
                                     "ddp": False}
_DISTRIBUTION_VARIABLES = (protocol.ENV_DISTRIBUTION, protocol.ENV_PIPELINE, "WORLD_SIZE")


@dataclass(frozen=True)
class TrainingEnvironment:
    model_dir: Path
    output_dir: Path
    output_data_dir: Path
    checkpoint_dir: Path
    channels: dict[str, Path]  # channel name (lower case, as SM_CHANNELS lists it) → local folder
    hyperparameters: dict[str, Any]
    hosts: list[str]
    current_host: str
    num_gpus: int = 0
    num_cpus: int = 1
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    job_id: str = ""
    attempt: int = 0
    node_name: str = ""
    checkpoint_every_steps: int = 0  # 0: only at the end of each epoch
    extra: dict[str, str] = field(default_factory=dict, repr=False)  # unused SM_* variables, for scripts
    # What read_distribution reads, as launched (TRAINYARD_DISTRIBUTION, TRAINYARD_PIPELINE,
    # WORLD_SIZE): a bad hand-made value is a DataError where `distribution` is used, not in from_env.
    distribution_variables: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def distribution(self) -> dict[str, Any]:
        """The job's distribution: read_distribution() of the variables this process got."""
        return read_distribution(self.distribution_variables)

    @property
    def is_main_process(self) -> bool:
        """Rank 0 writes model files and checkpoints; every rank logs."""
        return self.rank == 0

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    def channel(self, name: str) -> Path | None:
        return self.channels.get(name)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrainingEnvironment:
        env = os.environ if environ is None else environ
        base = Path(env.get("SM_BASE_DIR", SAGEMAKER_BASE))
        output_dir = Path(env.get("SM_OUTPUT_DIR", str(base / "output")))
        rank = _int(env, "RANK", 0)
        known = {"SM_MODEL_DIR", "SM_OUTPUT_DIR", "SM_OUTPUT_DATA_DIR", "SM_CHECKPOINT_DIR", "SM_CHANNELS", "SM_HPS",
                 "SM_HOSTS", "SM_CURRENT_HOST", "SM_NUM_GPUS", "SM_NUM_CPUS", "SM_BASE_DIR"}
        return cls(
            model_dir=Path(env.get("SM_MODEL_DIR", str(base / "model"))),
            output_dir=output_dir,
            output_data_dir=Path(env.get("SM_OUTPUT_DATA_DIR", str(output_dir / "data"))),
            checkpoint_dir=Path(env.get("SM_CHECKPOINT_DIR", str(base / "checkpoints"))),
            channels=_channels(env),
            hyperparameters=_hyperparameters(env),
            hosts=_json_list(env.get("SM_HOSTS")) or [env.get("SM_CURRENT_HOST") or socket.gethostname()],
            current_host=env.get("SM_CURRENT_HOST") or socket.gethostname(),
            num_gpus=_int(env, "SM_NUM_GPUS", 0),
            num_cpus=_int(env, "SM_NUM_CPUS", os.cpu_count() or 1),
            rank=rank,
            world_size=_int(env, "WORLD_SIZE", 1),
            local_rank=_int(env, "LOCAL_RANK", rank),
            job_id=env.get(protocol.ENV_JOB_ID, ""),
            attempt=_int(env, protocol.ENV_ATTEMPT, 0),
            node_name=env.get(protocol.ENV_NODE_NAME, ""),
            checkpoint_every_steps=max(_int(env, protocol.ENV_CHECKPOINT_EVERY_STEPS, 0), 0),
            extra={name: value for name, value in env.items()
                   if name.startswith("SM_") and name not in known and not name.startswith(_CHANNEL_PREFIX)},
            distribution_variables={name: env[name] for name in _DISTRIBUTION_VARIABLES if name in env},
        )


def distribution_variable(kind: str, pipeline: Mapping[str, Any] | None = None) -> str:
    """TRAINYARD_DISTRIBUTION's value for a job's `distribution` and `pipeline`: one JSON
    object, {"kind": kind}, and for "pipeline" every setting in PIPELINE_SETTINGS, the ones the
    job left out at their defaults."""
    value: dict[str, Any] = {"kind": kind}
    if kind == "pipeline":
        given = dict(pipeline or {})
        value.update({name: given.get(name, PIPELINE_DEFAULTS.get(name)) for name in PIPELINE_SETTINGS})
    return json.dumps(value)


def read_distribution(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job's distribution, from TRAINYARD_DISTRIBUTION: {"kind": "none" | "ddp" | "fsdp" |
    "pipeline", ...}; for "pipeline" with every setting ("stages", "microbatches", "schedule",
    "partition", "memory_cap_mb", "ddp").

    1. Takes the JSON object the runner writes, the bare word older runners wrote ("ddp"), or
       nothing ({"kind": "none"}, as in a run by hand).
    2. For "pipeline", a setting the object lacks comes from TRAINYARD_PIPELINE, then the
       API's default; "stages" last from WORLD_SIZE (a run by hand: one stage per process).
    3. A hand-made value the job could not run with is a DataError that says what is wrong."""
    env = os.environ if environ is None else environ
    name = protocol.ENV_DISTRIBUTION
    raw = env.get(name, "").strip()
    value: dict[str, Any]
    if not raw:
        value = {"kind": "none"}
    elif raw.isidentifier():
        value = {"kind": raw}
    else:
        value = _json_object(raw, name, ' such as {"kind": "ddp"}')
    kind = value.get("kind")
    if not isinstance(kind, str):
        raise DataError(f'{name} needs "kind": one of {", ".join(DISTRIBUTION_KINDS)}; got {raw[:200]!r}')
    if kind not in DISTRIBUTION_KINDS:
        raise DataError(f"{name}: unknown kind {kind!r}; use one of {', '.join(DISTRIBUTION_KINDS)}")
    if kind == "pipeline":
        value = {**value, **_pipeline_settings(value, env)}
    return value


def _json_object(raw: str, name: str, such_as: str = "") -> dict[str, Any]:
    """Variable `name`'s JSON object, or a DataError saying what it is instead."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{name} is not valid JSON: {exc} (got {raw[:200]!r})") from None
    if not isinstance(parsed, dict):
        raise DataError(f"{name} must be a JSON object{such_as}, got {raw[:200]!r}")
    return dict(parsed)


def _pipeline_settings(value: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """A pipeline's settings: the distribution object's, then TRAINYARD_PIPELINE's, then the
    defaults, each checked (the API checked a job's; a hand-made environment may be wrong)."""
    separate = _json_object(env.get(protocol.ENV_PIPELINE, "").strip() or "{}", protocol.ENV_PIPELINE)
    fallback: dict[str, Any] = {**PIPELINE_DEFAULTS, **separate}
    if "stages" not in fallback and env.get("WORLD_SIZE", "").strip():
        fallback["stages"] = _int(env, "WORLD_SIZE", 1)
    settings = {name: value[name] if name in value else fallback.get(name) for name in PIPELINE_SETTINGS}
    where = f"{protocol.ENV_DISTRIBUTION}: pipeline"

    def whole(name: str, minimum: int) -> None:
        number = settings[name]
        if not isinstance(number, int) or isinstance(number, bool) or number < minimum:
            raise DataError(f"{where} {name} must be a whole number ≥ {minimum}, got {number!r}")

    if settings["stages"] is None:
        raise DataError(f'{where} needs "stages" (in {protocol.ENV_DISTRIBUTION}, {protocol.ENV_PIPELINE} or from '
                        f"WORLD_SIZE)")
    whole("stages", 1)
    whole("microbatches", 1)
    if settings["memory_cap_mb"] is not None:
        whole("memory_cap_mb", 1)
    if settings["schedule"] not in PIPELINE_SCHEDULES:
        raise DataError(f"{where} schedule must be one of {', '.join(PIPELINE_SCHEDULES)}, got {settings['schedule']!r}")
    partition = settings["partition"]
    if not (partition in ("auto", "even") or (
            isinstance(partition, list) and partition
            and all(isinstance(count, int) and not isinstance(count, bool) and count >= 1 for count in partition))):
        raise DataError(f'{where} partition must be "auto", "even" or a list of layer counts per stage, got {partition!r}')
    if not isinstance(settings["ddp"], bool):
        raise DataError(f"{where} ddp must be true or false, got {settings['ddp']!r}")
    return settings


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        # A launcher bug, not the user's: say which variable is wrong rather than a bare int() error.
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _json_list(raw: str | None) -> list[str]:
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        # SageMaker writes JSON; a hand-set "a,b" is tolerated.
        return [part.strip() for part in raw.split(",") if part.strip()]
    return [str(item) for item in value] if isinstance(value, list) else [str(value)]


def _channels(env: Mapping[str, str]) -> dict[str, Path]:
    """SM_CHANNEL_<NAME> for every name SM_CHANNELS lists, plus any other SM_CHANNEL_*
    variable (a script run by hand often sets only those)."""
    names = [name.lower() for name in _json_list(env.get("SM_CHANNELS"))]
    for variable in env:
        if variable.startswith(_CHANNEL_PREFIX) and variable != "SM_CHANNELS":
            name = variable[len(_CHANNEL_PREFIX):].lower()
            if name not in names:
                names.append(name)
    channels: dict[str, Path] = {}
    for name in sorted(names):
        path = env.get(_CHANNEL_PREFIX + name.upper())
        if path:
            channels[name] = Path(path)
    return channels


def _hyperparameters(env: Mapping[str, str]) -> dict[str, Any]:
    """SM_HPS (JSON), else input/config/hyperparameters.json under SM_INPUT_CONFIG_DIR."""
    raw = env.get("SM_HPS")
    if raw is None and env.get("SM_INPUT_CONFIG_DIR"):
        path = Path(env["SM_INPUT_CONFIG_DIR"]) / "hyperparameters.json"
        if path.exists():
            raw = path.read_text(encoding="utf-8")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"SM_HPS is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"SM_HPS must be a JSON object, got {type(value).__name__}")
    return value
