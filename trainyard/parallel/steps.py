"""What every way of spreading a model over processes shares: the batches (TensorBatches),
the task (model, data, what to report), the running job as a plan sees it (Run), the seeded
order of steps (plan_steps) and the RNG state a resumable checkpoint carries.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from trainyard.env import TrainingEnvironment
from trainyard.parallel.context import Context

EVAL_BATCH_SIZE = 512


class Named(Protocol):
    @property
    def name(self) -> str: ...


class PointLogger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...


class Run(Protocol):
    """What a training plan reads of the running job (the built-in algorithms' Context is
    one): the algorithm's name, the environment, the hyperparameters, the process group and
    where log lines and metric points go."""

    @property
    def spec(self) -> Named: ...

    @property
    def env(self) -> TrainingEnvironment: ...

    @property
    def hps(self) -> dict[str, Any]: ...

    @property
    def dist(self) -> Context: ...

    @property
    def logger(self) -> PointLogger: ...

    def log(self, message: str) -> None: ...


class TensorBatches(torch.utils.data.Dataset):
    """Tensors indexed by a whole batch of indices at once: one gather per batch instead of
    one Python call and a collate per record."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        positions = torch.as_tensor(indices, dtype=torch.long)
        return tuple(tensor[positions] for tensor in self.tensors)


@dataclass
class Task:
    """A model whose forward takes every tensor of a batch but the last (the targets) and
    returns logits (..., classes); the loss is cross-entropy for classifiers and LMs alike."""

    model: nn.Module
    train: TensorBatches
    validation: TensorBatches | None
    test: TensorBatches | None = None
    report: Literal["accuracy", "perplexity"] = "accuracy"


def plan_steps(ctx: Run, task: Task, step: int, *, replicas: int,
               rank: int) -> tuple[DistributedSampler[int], int, int]:
    """(sampler, steps per epoch, last step) of a run over task.train: the order comes from
    DistributedSampler(seed, epoch) alone; epochs and max_steps bound the run. Logs the plan."""
    hps = ctx.hps
    sampler: DistributedSampler[int] = DistributedSampler(task.train, num_replicas=replicas, rank=rank, shuffle=True,
                                                          seed=hps["seed"])
    steps_per_epoch = math.ceil(len(sampler) / hps["batch_size"])
    last_step = hps["epochs"] * steps_per_epoch
    if hps["max_steps"]:
        last_step = min(last_step, hps["max_steps"])
    ctx.log(f"training {len(task.train)} records, {steps_per_epoch} steps per epoch, steps {step + 1}..{last_step}")
    return sampler, steps_per_epoch, last_step


def epoch_batches(ctx: Run, task: Task, sampler: DistributedSampler[int], step: int,
                  steps_per_epoch: int) -> DataLoader[Any]:
    """The batches of the epoch `step` falls in, from the one after `step` on: a resumed run
    sees exactly what an uninterrupted one would."""
    hps = ctx.hps
    epoch = step // steps_per_epoch
    sampler.set_epoch(epoch)
    batches = list(BatchSampler(sampler, hps["batch_size"], drop_last=False))[step - epoch * steps_per_epoch:]
    # Its own generator: without one, every DataLoader iterator draws its base seed from the
    # global RNG, which a resumed run would then consume at a different point than an
    # uninterrupted one, and dropout masks would diverge.
    return DataLoader(task.train, sampler=batches, batch_size=None,
                      generator=torch.Generator().manual_seed(hps["seed"] + epoch))


def rng_state() -> dict[str, Any]:
    legacy: Any = np.random.get_state(legacy=True)  # ("MT19937", keys, position, has_gauss, cached_gaussian)
    _, keys, position, has_gauss, cached_gaussian = legacy
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # As tensors and numbers: load_checkpoint's weights_only unpickler refuses ndarrays.
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(("MT19937", saved["keys"].numpy().astype(np.uint32), saved["position"], saved["has_gauss"],
                         saved["cached_gaussian"]))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
