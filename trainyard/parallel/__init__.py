"""How a training job spreads its model over its processes.

The public API, for user scripts and the built-in algorithms alike (docs/SPEC.md §3):

    import trainyard.parallel as tp
    ctx = tp.init(seed=0)                         # rank, world_size, local_rank, device, is_main, replicas
    model = tp.wrap(Net(), loss_fn=F.cross_entropy)  # as the job's distribution says: none, ddp, fsdp, pipeline
    loss = model.step(inputs, targets)            # forward + backward, then optimizer.step()
    tp.save({"model": model, "optimizer": optimizer}, step)   # sharded, into SM_CHECKPOINT_DIR
    step = tp.load({"model": model, "optimizer": optimizer})

The explicit forms are data_parallel(model), shard(model, cpu_offload=, mixed_precision=)
and pipeline(model, stages=, microbatches=, schedule=, partition=, memory_cap_mb=).

Inside: the process group (context, processes), the blocks of a model (blocks), the forms
(forms), where to cut a user's model (cuts) and the partitioner (partition), sharded
checkpoints (saving); the built-in algorithms' plans: every step shared (steps), replicated
DDP (replicated), FSDP (fsdp) and the layer pipeline (pipeline).

Nothing is imported here until a name is asked for: the partitioner is read without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Context": "context", "init": "context", "destroy": "context", "current": "context",
    "Parallel": "forms", "Pipelined": "forms", "wrap": "forms", "data_parallel": "forms", "shard": "forms",
    "pipeline": "forms", "save": "saving", "load": "saving", "model_state": "saving",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'trainyard.parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainyard.parallel.{module}"), name)
    globals()[name] = value
    return value
