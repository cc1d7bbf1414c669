"""A user's model spread over the job's processes as the job asked, in one call:

    ctx = trainyard.parallel.init(seed=0)
    model = trainyard.parallel.wrap(Net(), loss_fn=F.cross_entropy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for inputs, targets in loader:                   # sampler: num_replicas=ctx.replicas, rank=ctx.replica
        optimizer.zero_grad()
        loss = model.step(inputs, targets)           # forward + backward; the batch's mean loss
        optimizer.step()

`wrap` follows the job's distribution (TRAINYARD_DISTRIBUTION), so the same script runs as
one process, DDP, FSDP or a pipeline without edits; `data_parallel`, `shard` and `pipeline`
are the explicit forms. Every form returns a Parallel module: `step(inputs, targets)`
(forward and backward, with gradient accumulation over `gradient_accumulation` chunks of
the batch), `evaluate(inputs, targets)` (the loss without gradients), `parameters()` (what
this process's optimizer steps) and, but for a pipeline, an ordinary forward. What the form
did (the API that ran, the partition, fallbacks) is `model.report`, and is written as the
job's `parallel` report (and `fsdp` / `partition`, which the job page shows).

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from trainyard import report as reports
from trainyard.errors import DataError
from trainyard.parallel import blocks as blocklist
from trainyard.parallel.context import Context, current
from trainyard.parallel.partition import (
    MB,
    CostModel,
    Partition,
    auto_partition,
    balance,
    even_partition,
    manual_partition,
)
from trainyard.parallel.processes import emit
from trainyard.parallel.stages import StageClock, TimedStage, microbatches_for

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
SCHEDULES = ("gpipe", "1f1b")
# Assumed speed of a cut between neighbouring stages (bytes per ms), as the built-in pipeline.
BANDWIDTH_BYTES_PER_MS = {"gloo": 2e6, "nccl": 5e7}


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- the wrapped model ---------------------------------------------------------------------------
class Parallel(nn.Module):
    """The model as this process runs it. `module` is what it calls (the model, its DDP or
    FSDP form, or this process's pipeline stage); `model` is the model the script built."""

    model: nn.Module  # kept outside the module tree: its parameters are module's already

    def __init__(self, module: nn.Module, model: nn.Module, ctx: Context, kind: str, *, loss_fn: LossFn | None,
                 gradient_accumulation: int, report: dict[str, Any]) -> None:
        super().__init__()
        if gradient_accumulation < 1:
            raise ValueError(f"gradient_accumulation must be ≥ 1, got {gradient_accumulation}")
        self.module = module
        self.kind = kind
        self.ctx = ctx
        self.loss_fn = loss_fn or _cross_entropy
        self.gradient_accumulation = gradient_accumulation
        self.report = report
        # The model as built, outside the module tree (its parameters are module's).
        object.__setattr__(self, "model", model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @property
    def state_module(self) -> nn.Module:
        """The module whose state dict this process saves: names as in the script's model."""
        return self.model

    def step(self, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch (in `gradient_accumulation` chunks, gradients
        synchronised once); returns the batch's mean loss, detached."""
        inputs = _to(inputs, self.ctx.device)
        targets = targets.to(self.ctx.device)
        chunks = self.gradient_accumulation
        if chunks == 1:
            loss = self.loss_fn(self.module(*_args(inputs)), targets)
            loss.backward()
            return loss.detach()
        pieces = _split(inputs, targets, chunks)
        total = torch.zeros((), device=self.ctx.device)
        count = len(targets)
        for position, (chunk_inputs, chunk_targets) in enumerate(pieces):
            last = position == len(pieces) - 1
            with self._no_sync(not last):
                loss = self.loss_fn(self.module(*_args(chunk_inputs)), chunk_targets) * (len(chunk_targets) / count)
                loss.backward()
            total += loss.detach()
        return total

    @torch.no_grad()
    def predict(self, inputs: Any) -> Any:
        """The model's output for `inputs`, in eval mode and without gradients."""
        was_training = self.module.training
        self.module.eval()
        try:
            return self.module(*_args(_to(inputs, self.ctx.device)))
        finally:
            self.module.train(was_training)

    @torch.no_grad()
    def evaluate(self, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        was_training = self.module.training
        self.module.eval()
        try:
            return self.loss_fn(self.module(*_args(_to(inputs, self.ctx.device))), targets.to(self.ctx.device)).detach()
        finally:
            self.module.train(was_training)

    def measured(self) -> list[float] | None:
        """Every rank's peak memory, into the `parallel` report (and `fsdp`'s when sharded);
        collective: every rank calls it, at the end. Returns None (no stages to time)."""
        self.memory_per_rank = [round(row[0], 1) for row in _gathered(self.ctx, [_peak_memory_mb(self.ctx.device)])]
        what = "max_allocated_mb" if self.ctx.device.type == "cuda" else "peak_rss_mb"
        self.report = {**self.report, "memory_per_rank_mb": self.memory_per_rank, "memory_measure": what}
        if self.kind == "fsdp":
            reports.write("fsdp", self.report)
        _finish(self)
        return None

    def _no_sync(self, skip: bool) -> contextlib.AbstractContextManager[Any]:
        if not skip:
            return contextlib.nullcontext()
        if isinstance(self.module, nn.parallel.DistributedDataParallel):
            return self.module.no_sync()
        setter = getattr(self.module, "set_requires_gradient_sync", None)  # FSDP2
        if setter is not None:
            return _GradientSync(setter)
        return contextlib.nullcontext()


class _GradientSync(contextlib.AbstractContextManager[Any]):
    def __init__(self, setter: Callable[[bool], None]) -> None:
        self.setter = setter

    def __enter__(self) -> None:
        self.setter(False)

    def __exit__(self, *exc: object) -> None:
        self.setter(True)


def _args(inputs: Any) -> tuple[Any, ...]:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(item, device) for item in value)
    return value


def _contiguous(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, (list, tuple)):
        return type(value)(_contiguous(item) for item in value)
    return value


def _contiguous_gradients(args: tuple[Any, ...]) -> None:
    """Gradients flowing back into a stage's inputs made contiguous: the one of an input
    that the stage concatenates with another is a strided slice, which send and recv refuse."""
    for value in args:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            value.register_hook(lambda gradient: gradient.contiguous())


def _split(inputs: Any, targets: torch.Tensor, chunks: int) -> list[tuple[Any, torch.Tensor]]:
    size = math.ceil(len(targets) / chunks)
    pieces = []
    for start in range(0, len(targets), size):
        part = slice(start, start + size)
        chunk_inputs = type(inputs)(item[part] for item in inputs) if isinstance(inputs, (tuple, list)) else inputs[part]
        pieces.append((chunk_inputs, targets[part]))
    return pieces


# --- the forms -----------------------------------------------------------------------------------
def wrap(model: nn.Module, *, distribution: str | Mapping[str, Any] | None = None, loss_fn: LossFn | None = None,
         gradient_accumulation: int = 1, checkpoint_activations: bool = False,
         blocks: Iterable[nn.Module | str] | None = None, example_inputs: Any = None, **options: Any) -> Parallel:
    """The model in the form the job's distribution names ({"kind": "none"|"ddp"|"fsdp"|
    "pipeline", ...settings}), or the one given. Options of the explicit forms pass through
    (cpu_offload, mixed_precision for fsdp; stages, microbatches, schedule, partition,
    memory_cap_mb for pipeline), over the job's own settings."""
    ctx = current()
    unknown = sorted(set(options) - set(SHARD_OPTIONS) - set(PIPELINE_OPTIONS))
    if unknown:
        raise TypeError(f"wrap() got unknown option(s) {', '.join(unknown)}; the forms' options are "
                        f"{', '.join(SHARD_OPTIONS + PIPELINE_OPTIONS)}")
    settings = _distribution(distribution, ctx)
    kind = settings.pop("kind")
    common: dict[str, Any] = {"loss_fn": loss_fn, "gradient_accumulation": gradient_accumulation,
                              "checkpoint_activations": checkpoint_activations, "blocks": blocks,
                              "example_inputs": example_inputs}
    # An option of another form is kept for when the job runs as that form: the same
    # script, say with microbatches=8, also runs under ddp.
    if kind == "none":
        return _single(model, ctx, reason="distribution none", **common)
    if kind == "ddp":
        return data_parallel(model, **common)
    if kind == "fsdp":
        return shard(model, **{**_only(settings, SHARD_OPTIONS), **_only(options, SHARD_OPTIONS)}, **common)
    if kind == "pipeline":
        return pipeline(model, **{**_only(settings, PIPELINE_OPTIONS), **_only(options, PIPELINE_OPTIONS)}, **common)
    raise DataError(f"distribution {kind!r}: use none, ddp, fsdp or pipeline")


SHARD_OPTIONS = ("cpu_offload", "mixed_precision")
PIPELINE_OPTIONS = ("stages", "microbatches", "schedule", "partition", "memory_cap_mb")


def _only(settings: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {name: settings[name] for name in names if settings.get(name) is not None}


def _distribution(given: str | Mapping[str, Any] | None, ctx: Context) -> dict[str, Any]:
    if given is None:
        return dict(ctx.distribution)
    if isinstance(given, str):
        return {"kind": given}
    return dict(given)


def _blocks_of(model: nn.Module, given: Iterable[nn.Module | str] | None, example: Sequence[Any] | None) -> list[blocklist.Block]:
    units = blocklist.named(model, given) if given is not None else blocklist.candidates(model)
    if given is None and example is not None and not isinstance(model, nn.Sequential):
        units = blocklist.execution_order(model, units, example)
    return units


def _single(model: nn.Module, ctx: Context, *, reason: str, loss_fn: LossFn | None, gradient_accumulation: int,
            checkpoint_activations: bool, blocks: Iterable[nn.Module | str] | None, example_inputs: Any) -> Parallel:
    model = model.to(ctx.device)
    notes = _checkpointing(model, checkpoint_activations, blocks)
    report = {"api": "none", "world_size": ctx.world_size, "device": ctx.device.type, "why": reason,
              "gradient_accumulation": gradient_accumulation, "activation_checkpointing": notes}
    return _finish(Parallel(model, model, ctx, "none", loss_fn=loss_fn, gradient_accumulation=gradient_accumulation,
                            report=report))


def _checkpointing(model: nn.Module, enabled: bool, blocks: Iterable[nn.Module | str] | None) -> list[str] | None:
    if not enabled:
        return None
    units = _blocks_of(model, blocks, None)
    blocklist.checkpoint_activations(units)
    return [unit.name for unit in units]


def _finish(wrapped: Parallel) -> Parallel:
    reports.write("parallel", {"kind": wrapped.kind, **wrapped.report})
    return wrapped


def data_parallel(model: nn.Module, *, loss_fn: LossFn | None = None, gradient_accumulation: int = 1,
                  checkpoint_activations: bool = False, blocks: Iterable[nn.Module | str] | None = None,
                  example_inputs: Any = None, **ddp_options: Any) -> Parallel:
    """Every process holds the whole model; DistributedDataParallel averages gradients.
    With one process, the model alone (and the report says so)."""
    ctx = current()
    if ctx.world_size == 1:
        return _single(model, ctx, reason="one process: nothing to average over", loss_fn=loss_fn,
                       gradient_accumulation=gradient_accumulation, checkpoint_activations=checkpoint_activations,
                       blocks=blocks, example_inputs=example_inputs)
    model = model.to(ctx.device)
    notes = _checkpointing(model, checkpoint_activations, blocks)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    module = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **ddp_options)
    report = {"api": "DistributedDataParallel", "world_size": ctx.world_size, "backend": ctx.backend,
              "device": ctx.device.type, "gradient_accumulation": gradient_accumulation,
              "activation_checkpointing": notes}
    return _finish(Parallel(module, model, ctx, "ddp", loss_fn=loss_fn, gradient_accumulation=gradient_accumulation,
                            report=report))


def shard(model: nn.Module, *, cpu_offload: bool = False, mixed_precision: str | None = None,
          loss_fn: LossFn | None = None, gradient_accumulation: int = 1, checkpoint_activations: bool = False,
          blocks: Iterable[nn.Module | str] | None = None, example_inputs: Any = None) -> Parallel:
    """FSDP2: each block its own `fully_shard` unit, then the whole model, resharded after
    forward; parameters, gradients and optimizer state split over the processes. Options:
    cpu_offload (parameters and optimizer state on the CPU between uses), mixed_precision
    "bf16" (compute in bfloat16, gradients reduced in float32). Create the optimizer after
    shard, from model.parameters(). What cannot run here falls back loudly (a line on
    stdout and the `fsdp` report): one process → unsharded; fully_shard failing a probe
    step → DDP."""
    ctx = current()
    if mixed_precision not in (None, "bf16", "bfloat16", "fp32", "float32"):
        raise ValueError(f"mixed_precision: use 'bf16' or None, got {mixed_precision!r}")
    bf16 = mixed_precision in ("bf16", "bfloat16")
    fallbacks: list[str] = []
    model = model.to(ctx.device)
    example = _args(_to(example_inputs, ctx.device)) if example_inputs is not None else None
    units = _blocks_of(model, blocks, example)
    notes = [unit.name for unit in units] if checkpoint_activations else None
    if checkpoint_activations:
        blocklist.checkpoint_activations(units)

    def describe(api: str) -> dict[str, Any]:
        collective = api == "fully_shard"
        return {"api": api, "sharding": "FULL_SHARD" if collective else "NO_SHARD", "reshard_after_forward": collective,
                "units": [unit.name for unit in units] + ["(the whole model)"] if collective else None,
                "backend": ctx.backend or "none", "device": ctx.device.type, "world_size": ctx.world_size,
                "mixed_precision": "bf16 parameters, float32 reduction" if bf16 and collective else None,
                "param_dtype": "bfloat16" if bf16 and collective else "float32",
                "cpu_offload": bool(cpu_offload and collective), "fallbacks": list(fallbacks),
                "gradient_accumulation": gradient_accumulation, "activation_checkpointing": notes}

    def fall_back(feature: str, why: str, instead: str) -> None:
        fallbacks.append(f"{feature} did not run ({why}); using {instead}")
        emit(f"fsdp fallback: {fallbacks[-1]}")

    if ctx.world_size == 1:
        fall_back("sharding", "a single process has no process group to shard over",
                  "the whole model on one process, unsharded")
        reports.write("fsdp", describe("none"))
        return _finish(Parallel(model, model, ctx, "fsdp", loss_fn=loss_fn, gradient_accumulation=gradient_accumulation,
                                report=describe("none")))
    options = _fsdp_options(ctx, bf16, cpu_offload)
    try:
        _probe(ctx, options)
    except Exception as exc:  # whatever gloo or this build lacks
        fall_back("fully_shard", f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}", "DDP (replicated)")
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        module: nn.Module = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        reports.write("fsdp", describe("ddp"))
        return _finish(Parallel(module, model, ctx, "fsdp", loss_fn=loss_fn, gradient_accumulation=gradient_accumulation,
                                report=describe("ddp")))
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for unit in units:
        if unit.module is not model and not isinstance(unit.module, blocklist._Merged):
            fully_shard(unit.module, **options)
    fully_shard(model, **options)
    reports.write("fsdp", describe("fully_shard"))
    return _finish(Parallel(model, model, ctx, "fsdp", loss_fn=loss_fn, gradient_accumulation=gradient_accumulation,
                            report=describe("fully_shard")))


def _fsdp_options(ctx: Context, bf16: bool, cpu_offload: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    options: dict[str, Any] = {"reshard_after_forward": True}
    if bf16:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    return options


def _probe(ctx: Context, options: dict[str, Any]) -> None:
    """One step of a tiny sharded model with the same options: raises where fully_shard
    cannot run here. Seeded on its own generator, so the training RNG is untouched."""
    from torch.distributed.fsdp import fully_shard

    generator = torch.Generator().manual_seed(0)
    tiny = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    with torch.no_grad():
        for parameter in tiny.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    tiny = tiny.to(ctx.device)
    for layer in tiny:
        fully_shard(layer, **options)
    fully_shard(tiny, **options)
    optimizer = torch.optim.AdamW(tiny.parameters(), lr=1e-3)
    tiny(torch.randn(2, 4, generator=generator).to(ctx.device)).float().sum().backward()
    optimizer.step()


# --- pipeline ------------------------------------------------------------------------------------
def pipeline(model: nn.Module, *, stages: int | None = None, microbatches: int = 4, schedule: str = "gpipe",
             partition: str | Sequence[int] = "auto", memory_cap_mb: int | None = None, loss_fn: LossFn | None = None,
             gradient_accumulation: int = 1, checkpoint_activations: bool = False,
             blocks: Iterable[nn.Module | str] | None = None, example_inputs: Any = None) -> Pipelined:
    """The model cut into `stages` contiguous stages, one per process of a replica, each
    batch split into `microbatches` (torch.distributed.pipelining, GPipe or 1F1B). Every
    rank must build the same model (init(seed=…)) and feed the same batches to step() (the
    first stage reads the inputs, the last the targets). Cut points are the model's blocks
    (trainyard.parallel.blocks); partition "auto" profiles them on one microbatch and takes
    the exact min-max split under memory_cap_mb, "even" cuts equal counts, a list gives the
    count per stage. The stages are chosen at the first step (or now, with example_inputs).
    With more processes than stages, the replicas average their gradients (data parallel).
    gradient_accumulation does not apply: the microbatches are the accumulation."""
    ctx = current()
    if not stages:
        stages = ctx.stages if ctx.kind == "pipeline" else ctx.world_size
    if stages < 2:
        raise DataError("pipeline: needs at least 2 stages (2 processes); use distribution 'none' for one")
    if ctx.world_size % stages:
        raise DataError(f"pipeline: {stages} stages do not divide the {ctx.world_size} processes")
    if schedule not in SCHEDULES:
        raise DataError(f"pipeline: schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if microbatches < 1:
        raise DataError(f"pipeline: microbatches must be ≥ 1, got {microbatches}")
    if not (partition in ("auto", "even") or (isinstance(partition, (list, tuple)) and len(partition) == stages)):
        raise DataError(f'pipeline: partition must be "auto", "even" or {stages} block counts, got {partition!r}')
    wrapped = Pipelined(model, ctx, stages=stages, microbatches=microbatches, schedule=schedule,
                        partition=partition if isinstance(partition, str) else list(partition),
                        memory_cap_mb=memory_cap_mb, loss_fn=loss_fn, blocks=blocks,
                        checkpoint_activations=checkpoint_activations)
    if example_inputs is not None:
        wrapped.build(example_inputs)
    return wrapped


@dataclass
class _Groups:
    pipeline: Any  # this replica's stages
    data: Any  # this stage's replicas
    last_stage_rank: int  # global rank of this replica's last stage


class Pipelined(Parallel):
    """This process's stage of a pipelined model. `parameters()` before the stages are
    chosen are the whole model's (an optimizer made from them steps only what gets a
    gradient, this stage's); after, this stage's."""

    def __init__(self, model: nn.Module, ctx: Context, *, stages: int, microbatches: int, schedule: str,
                 partition: str | list[int], memory_cap_mb: int | None, loss_fn: LossFn | None,
                 blocks: Iterable[nn.Module | str] | None, checkpoint_activations: bool) -> None:
        super().__init__(model, model, ctx, "pipeline", loss_fn=loss_fn, gradient_accumulation=1, report={})
        self.stages = stages
        self.microbatches = microbatches
        self.schedule_name = schedule
        self.partition_spec = partition
        self.memory_cap_mb = memory_cap_mb
        self.given_blocks = list(blocks) if blocks is not None else None
        self.checkpoint_activations = checkpoint_activations
        self.stage = ctx.rank % stages
        self.replica = ctx.rank // stages
        self.replicas = ctx.world_size // stages
        self.built = False
        self.clock = StageClock()
        self.notes: list[str] = []
        self._schedules: dict[tuple[int, bool, bool], Any] = {}
        self.groups = self._make_groups()
        self.report = {"mode": partition if isinstance(partition, str) else "manual", "stages": stages,
                       "schedule": schedule, "microbatches": microbatches, "replicas": self.replicas}

    # --- process groups: replica r holds ranks r·stages … r·stages + stages − 1 ------------------
    def _make_groups(self) -> _Groups:
        mine_pipeline = mine_data = None
        for replica in range(self.replicas):
            ranks = [replica * self.stages + stage for stage in range(self.stages)]
            group = torch.distributed.new_group(ranks) if self.replicas > 1 else None
            if replica == self.replica:
                mine_pipeline = group
        for stage in range(self.stages):
            ranks = [replica * self.stages + stage for replica in range(self.replicas)]
            group = torch.distributed.new_group(ranks) if self.replicas > 1 else None
            if stage == self.stage:
                mine_data = group
        return _Groups(pipeline=mine_pipeline, data=mine_data, last_stage_rank=self.replica * self.stages + self.stages - 1)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a pipelined model has no plain forward (each process holds one stage): use "
                        "model.step(inputs, targets) to train and model.evaluate(inputs, targets) for a loss")

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    # --- choosing and building the stage -----------------------------------------------------------
    def build(self, example_inputs: Any, example_targets: torch.Tensor | None = None) -> None:
        """Choose the cuts (rank 0 profiles, every rank follows) and keep this stage."""
        from trainyard.parallel.cuts import profile_blocks, stage_module

        example = _args(example_inputs)
        batch = len(example[0])
        count = microbatches_for(batch, self.microbatches)
        micro = tuple(item[: batch // count] for item in example)
        units = _blocks_of(self.model, self.given_blocks, micro)
        if len(units) < self.stages:
            raise DataError(f"pipeline: {type(self.model).__name__} has {len(units)} blocks "
                            f"({', '.join(unit.name for unit in units)}): it cannot be cut into {self.stages} stages")

        def decide() -> tuple[Partition, CostModel | None, list[str]]:
            notes: list[str] = []
            costs: CostModel | None = None
            if self.partition_spec == "auto" or self.memory_cap_mb:
                # Without targets (example_inputs alone) the last block is timed without the loss.
                targets = example_targets[: len(micro[0])] if example_targets is not None else None
                layer_costs = profile_blocks(self.model, units, micro, targets, self.loss_fn)
                costs = CostModel(tuple(layer_costs), microbatches=count, schedule=self.schedule_name,
                                  bandwidth_bytes_per_ms=BANDWIDTH_BYTES_PER_MS.get(self.ctx.backend or "gloo", 2e6))
                where = next((parameter.device.type for parameter in self.model.parameters()), "cpu")
                notes.append(f"profiled each of {len(units)} blocks alone on a microbatch of {len(micro[0])} records "
                             f"on rank 0, where the script built the model ({where})")
            cap = self.memory_cap_mb * MB if self.memory_cap_mb else None
            if self.partition_spec == "auto":
                assert costs is not None
                chosen = auto_partition(costs, self.stages, cap)
            elif self.partition_spec == "even":
                chosen = even_partition(len(units), self.stages)
            else:
                assert isinstance(self.partition_spec, list)
                chosen = manual_partition(self.partition_spec, layers=len(units))
            return chosen, costs, notes

        chosen, costs, notes = self.ctx.decided_on_main(decide)
        self.notes.extend(notes)
        if self.checkpoint_activations:
            blocklist.checkpoint_activations(units)
        module = stage_module(self.model, units, chosen.ranges, self.stage, micro).to(self.ctx.device)
        # What crosses a cut goes through gloo/NCCL send and recv, which want contiguous
        # tensors; a traced stage may return views (and its gradients come back shaped so).
        module.register_forward_hook(lambda _module, _args, output: _contiguous(output))
        module.register_forward_pre_hook(lambda _module, args: _contiguous_gradients(args))
        self.module = module
        self.units, self.partition, self.costs = units, chosen, costs
        self.built = True
        first, last = chosen.ranges[self.stage]
        emit(f"pipeline stage {self.stage}/{self.stages}" + (f" of replica {self.replica}" if self.replicas > 1 else "")
             + f": blocks {first}..{last} ({', '.join(unit.name for unit in units[first:last + 1])}), "
             f"{sum(parameter.numel() for parameter in module.parameters())} parameters")
        self._write_report(None)

    def _write_report(self, measured: list[float] | None) -> None:
        names = [unit.name for unit in self.units]
        predicted = self.partition.predicted_ms(self.costs) if self.costs is not None else None
        self.report = {
            "mode": self.partition.mode, "stages": self.stages, "schedule": self.schedule_name,
            "microbatches": self.microbatches, "replicas": self.replicas, "layers": names,
            "stage_layers": [[first, last] for first, last in self.partition.ranges],
            "predicted_ms": [round(value, 3) for value in predicted] if predicted else None,
            "measured_ms": [round(value, 3) for value in measured] if measured else None,
            "balance_predicted": round(balance(predicted), 4) if predicted else None,
            "balance_measured": round(balance(measured), 4) if measured else None,
            "memory_mb": ([round(value / MB, 2) for value in self.partition.memory_bytes(self.costs)]
                          if self.costs is not None else None),
            "memory_cap_mb": self.memory_cap_mb, "notes": list(self.notes),
            "memory_per_rank_mb": getattr(self, "memory_per_rank", None),
        }
        reports.write("partition", self.report)
        reports.write("parallel", {"kind": "pipeline", **self.report})

    # --- schedules -------------------------------------------------------------------------------------
    def _schedule(self, batch: int, training: bool, with_loss: bool = True) -> Any:
        key = (batch, training, with_loss)
        if key not in self._schedules:
            count = microbatches_for(batch, self.microbatches)
            if count != self.microbatches and training:
                self.notes.append(f"a batch of {batch} records does not split into {self.microbatches} equal "
                                  f"microbatches: it ran as {count}")
            kind: Any = ScheduleGPipe
            if self.schedule_name == "1f1b" and training:
                if count >= self.stages:
                    kind = Schedule1F1B
                else:
                    self.notes.append(f"a batch of {batch} records ran as GPipe: {count} microbatches are fewer than "
                                      f"1F1B needs ({self.stages})")
            clock = self.clock
            stage = TimedStage(self.module, self.stage, self.stages, self.ctx.device, group=self.groups.pipeline,
                                clock=clock)
            loss_fn = self.loss_fn
            timed_loss = (lambda out, tgt: clock.timed(lambda: loss_fn(out, tgt))) if with_loss else None
            self._schedules[key] = kind(stage, count, loss_fn=timed_loss, scale_grads=True)
        return self._schedules[key]

    def _run(self, inputs: Any, targets: torch.Tensor | None, training: bool) -> tuple[torch.Tensor, Any]:
        if not self.built:
            self.build(inputs, targets)
        batch = len(_args(inputs)[0])
        schedule = self._schedule(batch, training, with_loss=targets is not None)
        losses: list[torch.Tensor] | None = [] if self.is_last and targets is not None else None
        args = _args(_to(inputs, self.ctx.device)) if self.is_first else ()
        target = targets.to(self.ctx.device) if self.is_last and targets is not None else None
        if training:
            outputs = schedule.step(*args, target=target, losses=losses, return_outputs=False)
        else:
            outputs = schedule.eval(*args, target=target, losses=losses)
        value = torch.stack(losses).detach().float().mean().reshape(1) if losses else torch.zeros(1, device=self.ctx.device)
        if targets is not None:
            torch.distributed.broadcast(value, src=self.groups.last_stage_rank, group=self.groups.pipeline)
        return value[0], outputs

    def step(self, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch through the stages; the batch's mean loss on
        every rank. With replicas, gradients are averaged over them before it returns."""
        self.clock.running = True
        try:
            loss, _ = self._run(inputs, targets, True)
        finally:
            self.clock.running = False
            self.clock.steps += 1
        if self.replicas > 1:
            for parameter in self.module.parameters():
                if parameter.grad is not None:
                    torch.distributed.all_reduce(parameter.grad, group=self.groups.data)
                    parameter.grad.div_(self.replicas)
        return loss

    @torch.no_grad()
    def evaluate(self, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        self.module.eval()
        try:
            return self._run(inputs, targets, False)[0]
        finally:
            self.module.train()

    @torch.no_grad()
    def predict(self, inputs: Any) -> Any:
        """The model's output for `inputs` on every rank of this replica (the last stage
        computes it and sends it to the others)."""
        self.module.eval()
        try:
            _, outputs = self._run(inputs, None, False)
        finally:
            self.module.train()
        box = [outputs.detach().cpu() if self.is_last and outputs is not None else None]
        torch.distributed.broadcast_object_list(box, src=self.groups.last_stage_rank, group=self.groups.pipeline)
        return _to(box[0], self.ctx.device)

    @property
    def state_module(self) -> nn.Module:
        return self.module

    def measured(self) -> list[float] | None:
        """Each stage's measured forward+backward ms per step and every rank's peak memory
        (collective: every rank calls it, at the end); written to the `partition` and
        `parallel` reports. None when a stage has not stepped."""
        mine = self.clock.seconds * 1000 / self.clock.steps if self.clock.steps else -1.0
        rows = _gathered(self.ctx, [mine, _peak_memory_mb(self.ctx.device)])
        self.memory_per_rank = [round(row[1], 1) for row in rows]
        values = [row[0] for row in rows[: self.stages]]
        if min(values) < 0:
            return None
        if self.built:
            self._write_report(values)
        return values


def _peak_memory_mb(device: torch.device) -> float:
    """CUDA: the most this process's tensors held on its device; CPU: the process's peak
    resident memory (the Python and torch runtime included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _gathered(ctx: Context, values: list[float]) -> list[list[float]]:
    """Every rank's `values`, in rank order, on every rank."""
    mine = torch.tensor(values, dtype=torch.float64)
    if ctx.world_size == 1:
        return [mine.tolist()]
    if ctx.backend == "nccl":
        mine = mine.to(ctx.device)
    gathered = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(gathered, mine)
    return [row.cpu().tolist() for row in gathered]
