"""Where to cut a user's model into pipeline stages, and the stage module each process keeps.

    costs = profile_blocks(model, units, example, targets, loss_fn)   # rank 0, one microbatch
    partition = auto_partition(CostModel(costs, ...), stages)           # trainyard.parallel.partition
    module = stage_module(model, units, partition.ranges, stage, example)

The cut points are the blocks of trainyard.parallel.blocks in execution order. Each block
is profiled alone on the inputs it received in one forward of an example microbatch:
forward and backward time (the fastest of several sweeps over all blocks), parameter bytes, what autograd keeps for
backward, and what it outputs (what crosses a cut after it). An nn.Sequential's stage is
its slice, under the items' own names; any other model is traced by torch.export and split
at the chosen blocks by torch.distributed.pipelining, whose stage modules keep the model's
parameter names, so a stage's state dict is a part of the whole model's.

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import math
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from trainyard.errors import DataError
from trainyard.parallel.blocks import Block, _Merged
from trainyard.parallel.partition import LayerCost, StageRange

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors(item)]
    if isinstance(value, dict):
        return [tensor for item in value.values() for tensor in _tensors(item)]
    return []


def _detached(value: Any) -> Any:
    """A fresh leaf of every floating tensor (so a block's backward stops at its inputs)."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.is_floating_point())
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(item) for item in value)
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    return value


def _bytes(value: Any) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in _tensors(value))


def profile_blocks(model: nn.Module, units: Sequence[Block], example: Sequence[Any], targets: torch.Tensor | None,
                   loss_fn: LossFn, *, repeats: int = 7, warmup: int = 1) -> list[LayerCost]:
    """Each block's cost for the example microbatch, run alone on what it received in one
    forward of the whole model. The last block's figures include the loss when its output
    is the model's. Timed in sweeps, each visiting every block once, and each block's
    fastest sweep kept: a burst of other work on a shared machine then spoils one sweep of
    every block, never all of one block's runs (which would move the cut). RNG state is
    restored afterwards: profiling never changes training."""
    captured: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    members = [unit.module.parts if isinstance(unit.module, _Merged) else [unit.module] for unit in units]

    def keep(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.setdefault(id(module), (_detached(args), _detached(kwargs)))

    handles = [part.register_forward_pre_hook(keep, with_kwargs=True) for parts in members for part in parts]
    devices = sorted({parameter.device.index or 0 for parameter in model.parameters() if parameter.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            with torch.no_grad():
                model_output = model(*example)
        finally:
            for handle in handles:
                handle.remove()
        probes = [[_Probe(part, *captured[id(part)], targets if index == len(units) - 1 and part is parts[-1] else None,
                          model_output, loss_fn) for part in parts] for index, parts in enumerate(members)]
        for sweep in range(warmup + repeats):
            for block in probes:
                for probe in block:
                    probe.once(keep=sweep >= warmup)
        costs = []
        for unit, block in zip(units, probes, strict=True):
            costs.append(LayerCost(name=unit.name, forward_ms=sum(probe.forward_ms for probe in block),
                                   backward_ms=sum(probe.backward_ms for probe in block),
                                   parameter_bytes=sum(p.numel() * p.element_size() for p in unit.module.parameters()),
                                   activation_bytes=sum(probe.saved_bytes() for probe in block),
                                   output_bytes=block[-1].output_bytes))
    return costs


class _Probe:
    """One module run alone on its captured inputs: forward and backward times (the
    fastest kept), what autograd saves for backward, and the size of what it outputs."""

    def __init__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], targets: torch.Tensor | None,
                 model_output: Any, loss_fn: LossFn) -> None:
        self.module, self.args, self.kwargs = module, args, kwargs
        self.targets, self.model_output, self.loss_fn = targets, model_output, loss_fn
        self.forward_ms = self.backward_ms = math.inf
        self.output_bytes = 0

    def _run(self) -> tuple[Any, list[torch.Tensor]]:
        output = self.module(*_detached(self.args), **_detached(self.kwargs))
        if (self.targets is not None and isinstance(output, torch.Tensor) and isinstance(self.model_output, torch.Tensor)
                and output.shape == self.model_output.shape):
            return output, [self.loss_fn(output, self.targets)]
        return output, [tensor for tensor in _tensors(output) if tensor.requires_grad]

    def once(self, keep: bool) -> None:
        # CUDA runs kernels asynchronously: without a synchronise the clock reads launches.
        on_cuda = any(parameter.is_cuda for parameter in self.module.parameters())
        synchronize = torch.cuda.synchronize if on_cuda else (lambda: None)
        synchronize()
        started = time.perf_counter()
        output, results = self._run()
        synchronize()
        middle = time.perf_counter()
        if results:
            torch.autograd.backward(results, [torch.ones_like(result) for result in results])
        synchronize()
        finished = time.perf_counter()
        self.module.zero_grad(set_to_none=True)
        self.output_bytes = _bytes(output)
        if keep:
            self.forward_ms = min(self.forward_ms, (middle - started) * 1000)
            self.backward_ms = min(self.backward_ms, (finished - middle) * 1000)

    def saved_bytes(self) -> int:
        parameters = {parameter.data_ptr() for parameter in self.module.parameters()}
        saved: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in parameters:
                saved[pointer] = max(saved.get(pointer, 0), tensor.untyped_storage().nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            self._run()
        return sum(saved.values())


def stage_module(model: nn.Module, units: Sequence[Block], ranges: Sequence[StageRange], stage: int,
                 example: Sequence[Any]) -> nn.Module:
    """This stage's part of the model: a Sequential's slice, or the traced split."""
    first, last = ranges[stage]
    if isinstance(model, nn.Sequential):
        return nn.Sequential(OrderedDict((units[index].name, units[index].module) for index in range(first, last + 1)))
    from torch.distributed.pipelining import SplitPoint, pipeline

    split_spec = {units[start].name.split("+", 1)[0]: SplitPoint.BEGINNING for start, _ in ranges[1:]}
    try:
        with warnings.catch_warnings():
            # torch.export's own deprecation notice, printed once per rank into the user's log.
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*", category=FutureWarning)
            pipe = pipeline(model, mb_args=tuple(example), split_spec=split_spec)
    except Exception as exc:
        raise DataError(untraceable(model, exc)) from None
    if pipe.num_stages != len(ranges):
        raise DataError(f"pipeline: tracing {type(model).__name__} gave {pipe.num_stages} stages where {len(ranges)} were "
                        f"asked for (cuts before {', '.join(split_spec)}): a cut point sits inside a block the "
                        "forward does not call at the top level; pass blocks=[...] naming the ones it calls in order")
    return pipe.get_stage_module(stage)


def untraceable(model: nn.Module, exc: BaseException) -> str:
    """What to tell a person whose model torch.export cannot trace: the call that failed,
    where in their code, and what to pass instead."""
    # torch.distributed.pipelining re-raises export's error as a generic one: the user's
    # frame and the real reason are down the chain of causes.
    chain: list[BaseException] = [exc]
    while len(chain) < 20:
        link = chain[-1].__cause__ or chain[-1].__context__
        if link is None or link in chain:
            break
        chain.append(link)
    frames = [frame for link in chain for frame in traceback.extract_tb(link.__traceback__)
              if "/torch/" not in frame.filename and "/trainyard/" not in frame.filename]
    exc = chain[-1]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})" if frames else ""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return (f"pipeline: torch.export could not trace {type(model).__name__}.forward{where}: {type(exc).__name__}: "
            f"{first}. Make forward traceable (no Python branches on tensor values, no .item() or .tolist()), "
            "or pass an nn.Sequential of the blocks in order, which is cut without tracing")
