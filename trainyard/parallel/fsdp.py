"""distribution "fsdp": the model's parameters, gradients and optimizer state sharded over
the processes, so each holds 1/world_size of them (and gathers a layer's weights only while
it runs). The training loop (algorithms.training.fit) trains with it as with DDP; only how
the model is spread differs.

The preferred API is torch's `fully_shard` (FSDP2): each top-level layer its own unit,
resharded after forward (FULL_SHARD). What cannot run here falls back *loudly*: a line
`fsdp fallback: <feature> did not run (<why>); using <instead>` on stdout and the same in
the `fsdp` report, never silently:
- one process (no process group to shard over) → the whole model, unsharded;
- fully_shard failing its probe → FullyShardedDataParallel (FSDP1, FULL_SHARD);
- that failing too → DDP (replicated, as distribution "ddp"). torch 2.13's FSDP1 needs an
  accelerator, so on CPU this is where a failed fully_shard ends up.
A probe runs a tiny sharded module through forward, backward and an optimizer step before
the real model is touched, so a collective gloo lacks shows up there, not mid-training.
Training is float32 throughout: char-lm has no precision setting, and float32 keeps a
sharded run's losses comparable with a replicated one's.

Checkpoints and model/ hold the full, unsharded state dict (gathered on rank 0), in the
format of any other run: a model trained sharded is served like any other.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from trainyard import report
from trainyard.parallel.context import Context
from trainyard.parallel.forms import Parallel
from trainyard.parallel.processes import emit
from trainyard.parallel.replicated import Replicated
from trainyard.parallel.steps import Run


class FullyShard(Replicated):
    def __init__(self, ctx: Run) -> None:
        self.ctx = ctx
        self.api = "fully_shard"  # what actually runs: fully_shard | FullyShardedDataParallel | ddp | none
        self.fallbacks: list[str] = []
        # FSDP1 wraps the model in a new module; the caller keeps the one it built.
        self.sharded: nn.Module | None = None

    # --- how the model is spread ----------------------------------------------------------------
    def prepare(self, model: nn.Module, dist: Context) -> nn.Module:
        """Shard with the first API that runs here; the `fsdp` report says which."""
        model = self._prepare(model, dist)
        report.write("fsdp", self.describe())
        return model

    def _prepare(self, model: nn.Module, dist: Context) -> nn.Module:
        model = model.to(dist.device)
        if dist.world_size == 1 or not torch.distributed.is_initialized():
            self._fall_back("sharding", "a single process has no process group to shard over",
                            "the whole model on one process, unsharded")
            self.api = "none"
            return model
        for api in ("fully_shard", "FullyShardedDataParallel"):
            try:
                _probe(api, dist)
            except Exception as exc:  # whatever gloo or this build lacks
                instead = "FullyShardedDataParallel (FSDP1), FULL_SHARD" if api == "fully_shard" else "DDP (replicated)"
                self._fall_back(api, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}", instead)
                continue
            self.api = api
            self.sharded = _shard(model, api, dist)
            return self.sharded
        self.api = "ddp"
        return model

    def wrap(self, model: nn.Module, dist: Context) -> Parallel:
        # A sharded model is its own training module; only the DDP fallback still wraps.
        if self.api == "ddp":
            return super().wrap(model, dist)
        return Parallel(self.sharded or model, model, dist, "fsdp", loss_fn=None, gradient_accumulation=1,
                        report=self.describe())

    @property
    def collective(self) -> bool:
        """Sharded: the full state must be gathered, and every rank must run each forward."""
        return self.api in ("fully_shard", "FullyShardedDataParallel")

    @property
    def collective_state(self) -> bool:
        return self.collective

    @property
    def eval_in_lockstep(self) -> bool:
        return self.collective

    # --- full (unsharded) state, in the format of an unsharded run ------------------------------
    def model_state(self, model: nn.Module) -> dict[str, Any]:
        if not self.collective:
            return super().model_state(model)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Gathered onto rank 0's CPU; the other ranks get {}.
        return get_model_state_dict(self.sharded or model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def optimizer_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if not self.collective:
            return super().optimizer_state(model, optimizer)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(self.sharded or model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict[str, Any],
             optimizer_state: dict[str, Any]) -> None:
        if not self.collective:
            super().load(model, optimizer, model_state, optimizer_state)
            return
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        # Every rank read the same checkpoint file: each keeps its own shard of it.
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.sharded or model, model_state, options=options)
        set_optimizer_state_dict(self.sharded or model, optimizer, optimizer_state, options=options)

    # --- reporting -------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        dist = self.ctx.dist
        backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
        sharding = {"fully_shard": "FULL_SHARD", "FullyShardedDataParallel": "FULL_SHARD"}.get(self.api, "NO_SHARD")
        return {"api": self.api, "sharding": sharding, "reshard_after_forward": self.collective,
                "units": "each top-level layer, then the whole model" if self.collective else None,
                "backend": backend, "device": dist.device.type, "world_size": dist.world_size,
                "mixed_precision": None, "param_dtype": "float32", "fallbacks": list(self.fallbacks)}

    def _fall_back(self, feature: str, why: str, instead: str) -> None:
        self.fallbacks.append(f"{feature} did not run ({why}); using {instead}")
        emit(f"fsdp fallback: {self.fallbacks[-1]}")


def _units(model: nn.Module) -> list[nn.Module]:
    """The layers sharded as their own units: a Sequential's items (char-lm's stack)."""
    return list(model) if isinstance(model, nn.Sequential) else []


def _shard(model: nn.Module, api: str, dist: Context) -> nn.Module:
    if api == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        # Nothing here changes a unit's output in place (the case that warning is about):
        # without the filter every job log carries it once per unit that returns a view.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
        for unit in _units(model):
            fully_shard(unit, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
        return model
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    unit_types = {type(unit) for unit in _units(model)}
    return FullyShardedDataParallel(model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
                                    auto_wrap_policy=ModuleWrapPolicy(unit_types) if unit_types else None,
                                    device_id=dist.device if dist.device.type == "cuda" else None)


def _probe(api: str, dist: Context) -> None:
    """One step of a tiny sharded model: raises where this API cannot run here. Seeded on
    its own generator, so the training RNG is untouched."""
    generator = torch.Generator().manual_seed(0)
    tiny = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    with torch.no_grad():
        for parameter in tiny.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    sharded = _shard(tiny.to(dist.device), api, dist)
    optimizer = torch.optim.AdamW(sharded.parameters(), lr=1e-3)
    sharded(torch.randn(2, 4, generator=generator).to(dist.device)).sum().backward()
    optimizer.step()
