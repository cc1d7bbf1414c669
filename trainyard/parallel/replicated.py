"""distribution "none" and "ddp": every process holds the whole model and, with two or
more, DistributedDataParallel averages the gradients. The default plan of a training loop.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainyard.parallel.context import Context
from trainyard.parallel.forms import Parallel


class Replicated:
    """How fit spreads a model over the processes, by default: each holds all of it and DDP
    averages the gradients (with one process, the model alone). trainyard.parallel.fsdp
    shards it instead; a training loop asks only these methods."""

    @property
    def collective_state(self) -> bool:
        """model_state/optimizer_state need every rank (they gather shards), not rank 0 alone."""
        return False

    @property
    def eval_in_lockstep(self) -> bool:
        """Every rank must run as many forwards as the others (a sharded forward all-gathers)."""
        return False

    def prepare(self, model: nn.Module, dist: Context) -> nn.Module:
        """The model whose parameters the optimizer steps."""
        return model.to(dist.device)

    def wrap(self, model: nn.Module, dist: Context) -> Parallel:
        """The module the training steps call: trainyard.parallel's data_parallel, as a
        user's script gets it (the model itself with one process)."""
        from trainyard.parallel.forms import data_parallel

        return data_parallel(model)

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        """The whole model's state dict, as one unsplit process would have it (rank 0's is
        the one saved)."""
        return model.state_dict()

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
             optimizer_state: dict[str, Any]) -> None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
