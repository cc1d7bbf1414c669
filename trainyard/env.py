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

SAGEMAKER_BASE = "/opt/ml"
_CHANNEL_PREFIX = "SM_CHANNEL_"


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
        )


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
