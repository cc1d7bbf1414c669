"""A model's blocks: the submodules that run one after another in its forward, which FSDP
shards as units, activation checkpointing recomputes, and a pipeline may cut between.

    units = blocks(model, example_inputs)   # [Block("embed", …), Block("layers.0", …), …]

- an nn.Sequential: its items, in order;
- a model that names its block list (`blocks=model.layers`, or module names): those;
- any other module: its top-level submodules in the order its forward first calls them,
  with containers (ModuleList, ModuleDict, Sequential) opened into their items, found by
  running forward once on an example with hooks. A submodule the forward never calls is
  left out; one it calls twice (a tied or reused module) cannot be a cut point, so it and
  what runs between its calls are one block.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


@dataclass(frozen=True)
class Block:
    name: str  # the module's qualified name in the model ("layers.3")
    module: nn.Module


def candidates(model: nn.Module) -> list[Block]:
    """Top-level submodules with containers opened, in definition order."""
    if isinstance(model, nn.Sequential):
        return [Block(name, module) for name, module in model.named_children()]
    found: list[Block] = []

    def open_up(prefix: str, module: nn.Module) -> None:
        if isinstance(module, CONTAINERS):
            for name, child in module.named_children():
                open_up(f"{prefix}.{name}", child)
        else:
            found.append(Block(prefix, module))

    for name, child in model.named_children():
        open_up(name, child)
    return found


def named(model: nn.Module, given: Iterable[nn.Module | str]) -> list[Block]:
    """Blocks the script named, as modules of the model or their qualified names."""
    by_module = {id(module): name for name, module in model.named_modules() if name}
    by_name = dict(model.named_modules())
    found = []
    for item in given:
        if isinstance(item, str):
            if item not in by_name or not item:
                raise ValueError(f"blocks: the model has no submodule {item!r}")
            found.append(Block(item, by_name[item]))
        elif id(item) in by_module:
            found.append(Block(by_module[id(item)], item))
        else:
            raise ValueError(f"blocks: {type(item).__name__} is not a submodule of the model")
    return found


def execution_order(model: nn.Module, units: Sequence[Block], example: Sequence[Any]) -> list[Block]:
    """`units` in the order one forward on `example` calls them; those it never calls are
    dropped, and a unit called twice merges with what ran between its calls."""
    calls: list[int] = []
    handles = [unit.module.register_forward_pre_hook(functools.partial(_record, calls, index))
               for index, unit in enumerate(units)]
    try:
        with torch.no_grad():
            model(*example)
    finally:
        for handle in handles:
            handle.remove()
    order: list[list[int]] = []
    for index in calls:
        group = next((group for group in order if index in group), None)
        if group is None:
            order.append([index])
            continue
        # Reused: everything from its first call onwards becomes one block.
        position = order.index(group)
        merged = [member for later in order[position:] for member in later]
        del order[position:]
        order.append(merged)
    result = []
    for group in order:
        if len(group) == 1:
            result.append(units[group[0]])
        else:
            names = ", ".join(units[index].name for index in group)
            result.append(Block("+".join(units[index].name for index in group), _Merged([units[i].module for i in group],
                                                                                          names)))
    return result


def _record(calls: list[int], index: int, module: nn.Module, args: Any) -> None:
    calls.append(index)


class _Merged(nn.Module):
    """Units that must stay together (one of them runs more than once); never called as a
    module, only counted and placed."""

    def __init__(self, modules: list[nn.Module], names: str) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)
        self.names = names


def checkpoint_activations(units: Sequence[Block]) -> None:
    """Recompute each block's activations in backward instead of keeping them: the
    block's forward runs under torch.utils.checkpoint (non-reentrant). Names and
    parameters stay as they were, so checkpoints and state dicts are unchanged."""
    for unit in units:
        module = unit.module
        if getattr(module, "_trainyard_checkpointed", False):
            continue
        original = module.forward

        def forward(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            return checkpoint(_original, *args, use_reentrant=False, **kwargs)

        module.forward = forward  # type: ignore[method-assign]
        module._trainyard_checkpointed = True  # type: ignore[assignment]
