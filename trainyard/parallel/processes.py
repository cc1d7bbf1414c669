"""The processes of one training job: one whole line per write to the shared output, the
torch.distributed process group (rank, world size, device), and seeding every RNG.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainyard.env import TrainingEnvironment


def emit(line: str, stream: Any = None) -> None:
    """One whole line in one write: ranks sharing a pipe then never interleave mid-line
    (print() writes the text and the newline separately)."""
    target = sys.stdout if stream is None else stream
    target.write(line + "\n")
    target.flush()


@dataclass
class Distributed:
    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so counts stay exact)."""
        if self.world_size == 1:
            return [float(value) for value in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor)
        return tensor.tolist()


def start_distributed(env: TrainingEnvironment) -> Distributed:
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{env.local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if env.world_size > 1:
        # env:// rendezvous: torch.distributed.run has set MASTER_ADDR/PORT, RANK, WORLD_SIZE.
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(rank=env.rank, world_size=env.world_size, device=device)


def stop_distributed(dist: Distributed) -> None:
    # Explicit teardown: gloo has been seen to abort at interpreter exit without it.
    if dist.world_size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def seed_everything(seed: int) -> None:
    # cuBLAS is only deterministic with a fixed workspace; must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
