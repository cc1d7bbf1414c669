"""A built-in algorithm's training process from start to exit: the environment and
hyperparameters read, seeding, the process group, the Context the algorithm trains with, and
bad input turned into $SM_OUTPUT_DIR/failure and exit status 2.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

import trainyard.parallel as tp
from algorithms.base import AlgorithmSpec, validate_hyperparameters
from algorithms.metrics import MetricLogger
from trainyard.env import TrainingEnvironment
from trainyard.env import read_distribution as read_job_distribution
from trainyard.errors import DataError
from trainyard.parallel.context import Context as Processes
from trainyard.parallel.processes import emit


@dataclass
class Context:
    spec: AlgorithmSpec
    env: TrainingEnvironment
    hps: dict[str, Any]
    dist: Processes  # trainyard.parallel.init(): rank, world size, device, the process group
    logger: MetricLogger = field(default_factory=MetricLogger)
    # The job's `distribution` (TRAINYARD_DISTRIBUTION): "none" and "ddp" both replicate the
    # model (DDP once there are two processes); "fsdp" shards it; "pipeline" cuts it in stages.
    distribution: str = "none"

    def log(self, message: str) -> None:
        emit(message)


def write_failure(output_dir: Path, reason: str) -> None:
    """Atomic, so two ranks failing alike leave one whole message, never an interleaving."""
    failure = output_dir / "failure"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        temporary = output_dir / f".failure.tmp-{os.getpid()}"
        temporary.write_text(reason.strip() + "\n", encoding="utf-8")
        os.replace(temporary, failure)
    except OSError as exc:
        emit(f"could not write {failure}: {exc}", sys.stderr)


def _fail(output_dir: Path, reason: str) -> NoReturn:
    write_failure(output_dir, reason)
    emit(f"error: {reason}", sys.stderr)
    if _world_size() > 1:
        exit_past_teardown(2)
    sys.exit(2)


def _world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or 1)
    except ValueError:
        return 1


def run_algorithm(spec: AlgorithmSpec, train: Callable[[Context], None]) -> None:
    """1. Read the environment and hyperparameters (strings coerced through the schema).
    2. Seed, join the process group, train. 3. On bad input write the reason to
    $SM_OUTPUT_DIR/failure and exit 2; the process group is always destroyed."""
    try:
        env = TrainingEnvironment.from_env()
    except ValueError as exc:  # SM_HPS that is not JSON, a RANK that is not a number
        _fail(Path(os.environ.get("SM_OUTPUT_DIR", "/opt/ml/output")), str(exc))
    try:
        hps, errors = validate_hyperparameters(spec, env.hyperparameters, allow_unknown=True)
        if errors:
            raise DataError("invalid hyperparameters: " + "; ".join(errors.values()))
        distribution = read_distribution(spec)
        emit(f"rank {env.rank}/{env.world_size} on host {env.current_host}: {spec.name} "
             f"WORLD_SIZE={env.world_size} LOCAL_RANK={env.local_rank} torch {torch.__version__} "
             f"threads={torch.get_num_threads()} distribution={distribution}")
        ignored = sorted(set(map(str, env.hyperparameters)) - set(hps))
        if ignored:
            emit(f"note: ignoring hyperparameters {spec.name} does not take: {', '.join(ignored)}")
        dist = tp.init(seed=hps["seed"])  # the same process group a user's script gets
        context = Context(spec=spec, env=env, hps=hps, dist=dist, distribution=distribution)
        try:
            train(context)
        finally:
            context.logger.close()
            tp.destroy()
    except DataError as exc:
        _fail(env.output_dir, str(exc))
    if env.world_size > 1:
        exit_past_teardown(0)


def exit_past_teardown(code: int) -> NoReturn:
    """End a distributed process that has finished its work without the interpreter's own
    teardown. Even with the process group destroyed, gloo aborted at exit in about 4 % of
    two-process runs ("terminate called without an active exception", SIGABRT, after the model
    was written): its threads meet the C++ static destructors. The exit hooks (the metric
    flush, logging) run first, while the interpreter is whole; then the streams are flushed
    and the process ends with `code`, past the destructors."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


def read_distribution(spec: AlgorithmSpec) -> str:
    """TRAINYARD_DISTRIBUTION's kind ("none" when unset, as in a run by hand), if the algorithm
    supports it; the API checks the same, so only a hand-made environment gets this far."""
    distribution = read_job_distribution()["kind"]
    if distribution not in spec.distributions:
        raise DataError(f"{spec.name} does not support distribution {distribution!r}; it supports "
                        f"{', '.join(spec.distributions)}")
    return distribution
