"""The process group of a user's training script, from the job's environment.

    ctx = trainyard.parallel.init(seed=0)
    sampler = DistributedSampler(data, num_replicas=ctx.replicas, rank=ctx.replica)
    ...
    trainyard.parallel.destroy()  # also registered to run at exit

torchrun (which every job runs under) sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous;
a script run by hand without them is one process. gloo on CPU, NCCL on CUDA with one device
per local rank. The job's distribution (TRAINYARD_DISTRIBUTION) rides along, so `wrap` and
the data sampler agree on what a replica is: a pipeline's stages share one replica's data.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from trainyard import env as job_env
from trainyard.errors import DataError
from trainyard.parallel.processes import seed_everything

_current: Context | None = None
T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    """This process's place in the job: rank, world size, local rank, device, and how the
    job spreads its model (distribution: {"kind": "none"|"ddp"|"fsdp"|"pipeline", ...})."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # "gloo" | "nccl", None with one process
    distribution: Mapping[str, Any] = field(default_factory=lambda: {"kind": "none"})

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the model and logs what is logged once."""
        return self.rank == 0

    @property
    def kind(self) -> str:
        return str(self.distribution.get("kind", "none"))

    @property
    def stages(self) -> int:
        """Pipeline stages (1 unless the distribution is a pipeline)."""
        return int(self.distribution.get("stages") or self.world_size) if self.kind == "pipeline" else 1

    @property
    def replicas(self) -> int:
        """How many copies of the model see different data: the world size, divided by the
        stages of a pipeline. Give it to the sampler as num_replicas."""
        return max(self.world_size // self.stages, 1)

    @property
    def replica(self) -> int:
        """Which copy this process belongs to (the sampler's rank). The ranks of one
        pipeline replica are consecutive: replica r holds ranks r·stages … r·stages+stages−1."""
        return self.rank // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over every process (float64, so counts stay exact)."""
        if self.world_size == 1:
            return [float(value) for value in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return tensor.tolist()

    def decided_on_main(self, decide: Callable[[], T]) -> T:
        """decide() on rank 0 and its result on every rank; a DataError or ValueError it
        raises (a bad partition, a checkpoint that does not fit) is raised on every rank
        alike, so none waits for a result that never comes."""
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", decide())
            except (DataError, ValueError) as exc:
                box[0] = ("error", str(exc))
        if self.world_size > 1:
            torch.distributed.broadcast_object_list(box, src=0)
        status, value = box[0]
        if status == "error":
            raise DataError(value)
        return value

    def mean(self, value: float | torch.Tensor) -> float:
        """A number averaged over every process (e.g. a validation loss each rank computed
        on its own part of the data)."""
        if self.world_size == 1:
            return float(value)
        tensor = torch.as_tensor(value, dtype=torch.float64, device=self.device).detach().clone().reshape(1)
        torch.distributed.all_reduce(tensor)
        return float(tensor.item()) / self.world_size


def init(seed: int | None = None, *, environ: Mapping[str, str] | None = None) -> Context:
    """The process group from the job's environment; the same Context on later calls (also
    after torch.distributed was initialised by the script itself). With a seed, Python's,
    numpy's and torch's generators are seeded alike on every rank, so every rank builds the
    same initial model, and torch uses its deterministic algorithms where it has them."""
    global _current
    environ = os.environ if environ is None else environ
    if seed is not None:
        seed_everything(seed)
    if _current is not None:
        return _current
    world_size = _int(environ, "WORLD_SIZE", 1)
    rank = _int(environ, "RANK", 0)
    local_rank = _int(environ, "LOCAL_RANK", rank)
    if not 0 <= rank < world_size:
        raise DataError(f"RANK {rank} is outside WORLD_SIZE {world_size}")
    distribution = job_env.read_distribution(environ)
    if distribution.get("kind") == "pipeline":
        stages = int(distribution.get("stages") or world_size)
        if world_size < stages:
            raise DataError(f"pipeline: {stages} stages need {stages} processes (one per stage), but WORLD_SIZE is "
                            f"{world_size}")
        if world_size % stages:
            raise DataError(f"pipeline: {stages} stages do not divide {world_size} processes; give instance_count × "
                            "processes per node as a multiple of the stages")
        if world_size > stages and not distribution.get("ddp", False):
            raise DataError(f"pipeline: {world_size} processes for {stages} stages needs \"ddp\": true (data parallel "
                            "across the pipeline's replicas), or as many processes as stages")
    use_cuda = torch.cuda.is_available()
    local_world = _int(environ, "LOCAL_WORLD_SIZE", 1)
    if use_cuda and world_size > 1 and local_world > torch.cuda.device_count():
        raise DataError(f"{local_world} processes on this node but {torch.cuda.device_count()} GPU(s): NCCL needs one GPU "
                        "per process; set processes_per_node to at most the GPU count")
    if use_cuda:
        device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend: str | None = None
    if world_size > 1:
        if not torch.distributed.is_initialized():
            # env:// rendezvous: torchrun has set MASTER_ADDR/PORT, RANK and WORLD_SIZE.
            torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
        backend = str(torch.distributed.get_backend())
    _current = Context(rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend,
                       distribution=distribution)
    atexit.register(destroy)
    return _current


def current() -> Context:
    """The Context of init(), initialising with no seed if the script has not called it."""
    return _current if _current is not None else init()


def destroy() -> None:
    """Tear the process group down (idempotent). Explicitly, before the interpreter exits:
    gloo has been seen to abort at exit without it (ARCHITECTURE: gloo teardown)."""
    global _current
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _current = None


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = str(environ.get(name, "")).strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DataError(f"{name} must be a whole number, got {raw!r}") from None
