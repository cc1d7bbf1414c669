"""The processes of one training job: one whole line per write to the shared output, and
seeding every RNG (the process group is trainyard.parallel.context's).

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import numpy as np
import torch


def emit(line: str, stream: Any = None) -> None:
    """One whole line in one write: ranks sharing a pipe then never interleave mid-line
    (print() writes the text and the newline separately)."""
    target = sys.stdout if stream is None else stream
    target.write(line + "\n")
    target.flush()


def seed_everything(seed: int) -> None:
    # cuBLAS is only deterministic with a fixed workspace; must be set before CUDA starts.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
