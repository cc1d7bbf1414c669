"""distribution "pipeline" for the built-in algorithms' stacks of layers (a user's model goes
through trainyard.parallel.pipeline): the layers cut into contiguous stages, one per process,
each batch split into microbatches that flow through the stages (torch.distributed.pipelining:
PipelineStage with ScheduleGPipe or Schedule1F1B).

    metrics, weights = stages.fit(ctx, task, layers, names)  # weights: the whole model, on rank 0

1. Partition (rank 0 decides, every rank follows): "auto" profiles each layer on a sample
   microbatch and takes the exact min-max split (trainyard.parallel.partition), under
   memory_cap_mb; "even" and a list of counts are taken as given. A resumed run keeps its
   checkpoint's partition, so each stage finds its own optimizer state.
2. Every rank has built the whole model from the same seed and keeps its stage's layers,
   under their original indices, so stage state dicts merge into the unsplit model's.
3. Train as the replicated loop (algorithms.training.fit) does, and over the same batches as a one-process run (the sampler is
   the one-process sampler on every rank): the loss is summed per microbatch and scaled by
   the whole batch's token count, so the microbatches' gradients add up to the batch's.
   Only the last stage knows the loss; it is broadcast when reported, and every rank logs it.
4. Checkpoints and model/ hold the whole model, gathered on rank 0 (optimizer and RNG
   state per stage ride along in the checkpoint).
The `partition` report (trainyard.report) is written once the partition is chosen and again
at the end with each stage's measured forward+backward time.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainyard import checkpoints, protocol, report
from trainyard.env import read_distribution
from trainyard.errors import DataError
from trainyard.parallel.partition import (
    MB,
    CostModel,
    Partition,
    StageRange,
    auto_partition,
    balance,
    even_partition,
    manual_partition,
    profile_layers,
)
from trainyard.parallel.steps import EVAL_BATCH_SIZE, Run, Task, TensorBatches, epoch_batches, plan_steps, restore_rng, rng_state

SCHEDULES = ("gpipe", "1f1b")
# Assumed speed of a cut between neighbouring stages (bytes per ms): the partitioner weighs
# moving activations against compute with it. Loopback TCP for gloo, NVLink-class for NCCL.
BANDWIDTH_BYTES_PER_MS = {"gloo": 2e6, "nccl": 5e7}
PROFILE_REPEATS = 5
T = TypeVar("T")


@dataclass(frozen=True)
class PipelineSettings:
    stages: int
    microbatches: int = 4
    schedule: str = "gpipe"
    partition: str | list[int] = "auto"
    memory_cap_mb: int | None = None

    @classmethod
    def from_env(cls, world_size: int) -> PipelineSettings:
        """The job's pipeline settings (trainyard.env.read_distribution: what the API
        validated); a run by hand may leave them out and get one stage per process.
        DataError for what a hand-made value gets wrong."""
        values = read_distribution({**os.environ, "WORLD_SIZE": str(world_size),
                                    protocol.ENV_DISTRIBUTION: os.environ.get(protocol.ENV_DISTRIBUTION) or "pipeline"})
        settings = cls(stages=int(values["stages"]), microbatches=int(values["microbatches"]),
                       schedule=str(values["schedule"]), partition=values["partition"],
                       memory_cap_mb=values["memory_cap_mb"])
        if settings.stages != world_size:
            raise DataError(f"pipeline: {settings.stages} stages need {settings.stages} processes (one per stage), "
                            f"but WORLD_SIZE is {world_size}")
        if settings.stages < 2:
            raise DataError("pipeline: needs at least 2 stages (2 processes); use distribution 'none' for one")
        return settings

    @property
    def mode(self) -> str:
        return self.partition if isinstance(self.partition, str) else "manual"


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Cross-entropy summed over a microbatch's tokens, × scale. With scale = 1 / the whole
    batch's tokens the microbatches' losses add up to the batch's mean loss, exactly what an
    unsplit step minimises, even when the microbatches differ in size."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum") * scale


def microbatches_for(batch: int, wanted: int) -> int:
    """The most microbatches ≤ wanted that split `batch` records equally: the stages set up
    their receive buffers from the first microbatch's shape, so they must all match."""
    return max(count for count in range(1, min(batch, wanted) + 1) if batch % count == 0)


# --- timing and the stages -----------------------------------------------------------------------
@dataclass
class StageClock:
    """This stage's compute time (forwards, backwards, the loss) in training steps; the waits
    for neighbours are outside it."""

    running: bool = False
    seconds: float = 0.0
    steps: int = 0

    def timed(self, work: Callable[[], T]) -> T:
        if not self.running:
            return work()
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.seconds += time.perf_counter() - started

    @property
    def ms_per_step(self) -> float | None:
        return self.seconds * 1000 / self.steps if self.steps else None


class TimedStage(PipelineStage):
    def __init__(self, *args: Any, clock: StageClock, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self.clock.timed(lambda: super(TimedStage, self).forward_one_chunk(*args, **kwargs))

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self.clock.timed(lambda: super(TimedStage, self).backward_one_chunk(*args, **kwargs))


@dataclass
class StageRunner:
    """This process's stage and the schedules that drive it, one per (batch size, train or
    eval): a schedule's stage fixes its buffers' shapes on first use."""

    module: nn.Module
    index: int
    stages: int
    device: torch.device
    settings: PipelineSettings
    clock: StageClock = field(default_factory=StageClock)
    notes: list[str] = field(default_factory=list)
    _schedules: dict[tuple[int, bool], Any] = field(default_factory=dict)

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.stages - 1

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.clock.timed(lambda: summed_cross_entropy(logits, targets, scale))

    def schedule(self, batch: int, training: bool) -> Any:
        key = (batch, training)
        if key not in self._schedules:
            count = microbatches_for(batch, self.settings.microbatches)
            if count != self.settings.microbatches and training:
                self.notes.append(f"a batch of {batch} records does not split into {self.settings.microbatches} equal "
                                  f"microbatches: it ran as {count}")
            kind: Any = ScheduleGPipe
            if self.settings.schedule == "1f1b" and training:
                if count >= self.stages:
                    kind = Schedule1F1B
                else:  # torch's 1F1B needs at least one microbatch per stage
                    self.notes.append(f"a batch of {batch} records ran as GPipe: {count} microbatches are fewer than "
                                      f"1F1B needs ({self.stages})")
            stage = TimedStage(self.module, self.index, self.stages, self.device, clock=self.clock)
            self._schedules[key] = kind(stage, count, loss_fn=self._loss, scale_grads=False)
        return self._schedules[key]

    def _run(self, inputs: torch.Tensor, targets: torch.Tensor, training: bool, scale: float) -> float | None:
        schedule = self.schedule(len(targets), training)
        losses: list[torch.Tensor] | None = [] if self.is_last else None
        args = (inputs.to(self.device),) if self.is_first else ()
        target = targets.to(self.device) if self.is_last else None
        run = schedule.step if training else schedule.eval
        extra = {"return_outputs": False} if training else {}
        run(*args, target=target, losses=losses, loss_kwargs={"scale": scale}, **extra)
        return float(torch.stack(losses).detach().sum()) if losses else None

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        """One batch forward and backward; its mean loss on the last stage, None elsewhere."""
        self.clock.running = True
        try:
            return self._run(inputs, targets, True, 1.0 / targets.numel())
        finally:
            self.clock.running = False
            self.clock.steps += 1

    @torch.no_grad()
    def loss_sum(self, inputs: torch.Tensor, targets: torch.Tensor) -> float | None:
        return self._run(inputs, targets, False, 1.0)


# --- collectives --------------------------------------------------------------------------------
def _from_last_stage(ctx: Run, values: list[float] | None, count: int) -> list[float]:
    """Figures only the last stage has (losses), sent to every rank."""
    tensor = torch.tensor(values if values is not None else [0.0] * count, dtype=torch.float64, device=ctx.dist.device)
    torch.distributed.broadcast(tensor, src=ctx.dist.world_size - 1)
    return tensor.tolist()


def _cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(item) for item in value)
    return value


def _gather_on_main(ctx: Run, piece: Any) -> list[Any] | None:
    pieces: list[Any] | None = [None] * ctx.dist.world_size if ctx.dist.is_main else None
    torch.distributed.gather_object(_cpu(piece), pieces, dst=0)
    return pieces


def _layer_of(key: str) -> int:
    return int(key.split(".", 1)[0])


# --- partition ----------------------------------------------------------------------------------
@dataclass
class Plan:
    partition: Partition
    costs: CostModel
    notes: list[str]


def _plan(ctx: Run, settings: PipelineSettings, task: Task, layers: list[nn.Module],
          names: list[str], resumed: tuple[int, list[StageRange]] | None) -> Plan:
    """Rank 0: profile, choose (or take) the partition, write the first report."""
    hps = ctx.hps
    backend = torch.distributed.get_backend()
    count = microbatches_for(min(hps["batch_size"], len(task.train)), settings.microbatches)
    sample = min(hps["batch_size"], len(task.train)) // count
    inputs, targets = task.train[list(range(sample))]
    costs = CostModel(tuple(profile_layers(layers, names, inputs, targets, summed_cross_entropy, repeats=PROFILE_REPEATS,
                                           device=ctx.dist.device)),
                      microbatches=settings.microbatches, schedule=settings.schedule,
                      bandwidth_bytes_per_ms=BANDWIDTH_BYTES_PER_MS.get(backend, 2e6))
    cap = settings.memory_cap_mb * MB if settings.memory_cap_mb else None
    notes = [f"profiled each layer alone on a microbatch of {sample} records ({PROFILE_REPEATS} runs, median) "
             f"on rank 0 ({ctx.dist.device.type})",
             f"a cut costs its activation forward and its gradient backward per microbatch, at an assumed "
             f"{costs.bandwidth_bytes_per_ms / 1000:g} MB/s ({backend})",
             f"memory: parameters × {costs.optimizer_factor:g} (weights, gradients, AdamW moments) + activations × "
             f"microbatches in flight ({settings.schedule})"]
    if resumed is not None:
        step, ranges = resumed
        partition = Partition(tuple((first, last) for first, last in ranges), settings.mode)
        notes.append(f"resumed from checkpoint step {step}: kept its partition, so each stage finds its own optimizer state")
    elif settings.mode == "auto":
        partition = auto_partition(costs, settings.stages, cap)
    elif settings.mode == "even":
        partition = even_partition(len(layers), settings.stages)
    else:
        assert isinstance(settings.partition, list)
        if len(settings.partition) != settings.stages:
            raise DataError(f"pipeline: the partition {settings.partition} gives {len(settings.partition)} stages "
                            f"but stages is {settings.stages}")
        partition = manual_partition(settings.partition, layers=len(layers))
    if cap is not None and settings.mode != "auto":
        for stage, needed in enumerate(partition.memory_bytes(costs)):
            if needed > cap:
                notes.append(f"stage {stage} is predicted to need {needed / MB:.1f} MB, over memory_cap_mb="
                             f"{settings.memory_cap_mb} (the cap binds only partition \"auto\")")
    return Plan(partition, costs, notes)


def _report(settings: PipelineSettings, plan: Plan, names: list[str], measured: list[float] | None,
            notes: list[str]) -> dict[str, Any]:
    predicted = plan.partition.predicted_ms(plan.costs)
    return {
        "mode": settings.mode,
        "stages": settings.stages,
        "schedule": settings.schedule,
        "microbatches": settings.microbatches,
        "layers": list(names),
        "stage_layers": [[first, last] for first, last in plan.partition.ranges],
        "predicted_ms": [round(value, 3) for value in predicted],
        "measured_ms": [round(value, 3) for value in measured] if measured is not None else None,
        "balance_predicted": round(balance(predicted), 4),
        "balance_measured": round(balance(measured), 4) if measured is not None else None,
        "memory_mb": [round(value / MB, 2) for value in plan.partition.memory_bytes(plan.costs)],
        "memory_cap_mb": settings.memory_cap_mb,
        "notes": list(notes),
    }


# --- checkpoints --------------------------------------------------------------------------------
def _read_checkpoint(ctx: Run, stages: int) -> tuple[int, list[StageRange], list[dict[str, Any]]] | None:
    """Rank 0: the newest readable checkpoint as (step, partition, each stage's piece)."""
    for step, path, state in checkpoints.readable_checkpoints(ctx.env.checkpoint_dir, ctx.spec.name):
        saved = state.get("pipeline")
        if not saved:
            raise DataError(f"checkpoint {path.name} was written by a run without pipeline stages: use an empty "
                            "checkpoint location to train with distribution 'pipeline'")
        ranges = [(int(first), int(last)) for first, last in saved["stage_layers"]]
        if len(ranges) != stages:
            raise DataError(f"checkpoint {path.name} was written by a pipeline of {len(ranges)} stages, this one has "
                            f"{stages}: use the same stages or an empty checkpoint location")
        pieces = [{"model": {key: value for key, value in state["model"].items() if first <= _layer_of(key) <= last},
                   "optimizer": saved["optimizers"][stage], "rng": saved["rngs"][stage]}
                  for stage, (first, last) in enumerate(ranges)]
        return step, ranges, pieces
    return None


def _save_checkpoint(ctx: Run, runner: StageRunner, optimizer: torch.optim.Optimizer,
                     ranges: list[StageRange], step: int, epoch: int) -> None:
    pieces = _gather_on_main(ctx, {"model": runner.module.state_dict(), "optimizer": optimizer.state_dict(),
                                   "rng": rng_state()})
    if pieces is None:
        return
    model: dict[str, torch.Tensor] = {}
    for piece in pieces:
        model.update(piece["model"])
    state = {"algorithm": ctx.spec.name, "step": step, "epoch": epoch, "model": model, "rng": pieces[0]["rng"],
             "pipeline": {"stage_layers": [list(pair) for pair in ranges],
                          "optimizers": [piece["optimizer"] for piece in pieces],
                          "rngs": [piece["rng"] for piece in pieces]}}
    path = checkpoints.save_checkpoint(state, step, ctx.env.checkpoint_dir)
    ctx.log(f"saved checkpoint {path.name} at step {step}")


# --- evaluation ---------------------------------------------------------------------------------
def _evaluate(ctx: Run, runner: StageRunner, data: TensorBatches, prefix: str) -> dict[str, float]:
    """Every rank runs every batch (each holds a part of each forward); the last stage's
    sums reach all ranks, so all report the same figures."""
    runner.module.eval()
    total = count = 0.0
    for start in range(0, len(data), EVAL_BATCH_SIZE):
        inputs, targets = data[list(range(start, min(start + EVAL_BATCH_SIZE, len(data))))]
        summed = runner.loss_sum(inputs, targets)
        if summed is not None:
            total += summed
            count += targets.numel()
    runner.module.train()
    total, count = _from_last_stage(ctx, [total, count] if runner.is_last else None, 2)
    loss = total / max(count, 1.0)
    return {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 50.0))}


# --- training -----------------------------------------------------------------------------------
def fit(ctx: Run, task: Task, layers: list[nn.Module],
        names: list[str]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Train `layers` (the model is nn.Sequential(*layers)) as a pipeline of one stage per
    process. Returns (final metrics on every rank, the whole model's state dict on rank 0
    and {} elsewhere)."""
    if task.report != "perplexity":
        raise DataError("pipeline: only language models (loss and perplexity) train as a pipeline")
    hps, dist = ctx.hps, ctx.dist
    settings = PipelineSettings.from_env(dist.world_size)
    if len(layers) < settings.stages:
        raise DataError(f"pipeline: the model has {len(layers)} layers: it cannot be cut into {settings.stages} stages")

    # 1. Resume point and partition, decided on rank 0.
    found: list[Any] = [None]  # rank 0: (step, partition, each stage's piece)

    def read_checkpoint() -> tuple[int, list[StageRange]] | None:
        found[0] = _read_checkpoint(ctx, settings.stages)
        return (found[0][0], found[0][1]) if found[0] else None

    resumed = ctx.dist.decided_on_main(read_checkpoint)
    plan = ctx.dist.decided_on_main(lambda: _plan(ctx, settings, task, layers, names, resumed))
    if dist.is_main:
        report.write("partition", _report(settings, plan, names, None, plan.notes))
    ranges = list(plan.partition.ranges)
    first, last = ranges[dist.rank]

    # 2. This rank's stage, under the layers' own indices.
    module = nn.Sequential(OrderedDict((str(index), layers[index]) for index in range(first, last + 1))).to(dist.device)
    optimizer = torch.optim.AdamW(module.parameters(), lr=hps["learning_rate"], weight_decay=hps["weight_decay"])
    runner = StageRunner(module, dist.rank, settings.stages, dist.device, settings)
    ctx.log(f"pipeline stage {dist.rank}/{settings.stages}: layers {first}..{last} ({', '.join(names[first:last + 1])}), "
            f"{sum(parameter.numel() for parameter in module.parameters())} parameters, "
            f"{settings.microbatches} microbatches, {settings.schedule}")
    step = 0
    if resumed is not None:
        pieces: list[Any] = [None]
        torch.distributed.scatter_object_list(pieces, found[0][2] if dist.is_main else None, src=0)
        piece = pieces[0]
        try:
            module.load_state_dict(piece["model"])
            optimizer.load_state_dict(piece["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise DataError(f"checkpoint step {resumed[0]} does not fit this model (were the data or the architecture "
                            f"hyperparameters changed?): {str(exc).splitlines()[0]}") from None
        restore_rng(piece["rng"])
        step = resumed[0]
        ctx.log(f"resumed from checkpoint step {step}")

    # 3. The replicated training loop, over the batches a one-process run sees.
    sampler, steps_per_epoch, last_step = plan_steps(ctx, task, step, replicas=1, rank=0)
    every = ctx.env.checkpoint_every_steps
    final: dict[str, float] = {}
    evaluated_at = checkpointed_at = -1
    loss_total, loss_count = 0.0, 0
    started, first_step = time.monotonic(), step
    module.train()
    while step < last_step:
        for inputs, targets in epoch_batches(ctx, task, sampler, step, steps_per_epoch):
            step += 1
            optimizer.zero_grad(set_to_none=True)
            loss = runner.train_step(inputs, targets)
            optimizer.step()
            if loss is not None:
                loss_total += loss
            loss_count += 1
            if step % hps["log_every_steps"] == 0 or step == last_step:
                (final["train_loss"],) = _from_last_stage(ctx, [loss_total / loss_count] if runner.is_last else None, 1)
                ctx.logger.log({"train_loss": final["train_loss"]}, step)
                loss_total, loss_count = 0.0, 0
            epoch_done = step % steps_per_epoch == 0
            if epoch_done:
                if task.validation is not None:
                    final.update(_evaluate(ctx, runner, task.validation, "validation"))
                    evaluated_at = step
                ctx.logger.log({"epoch": step // steps_per_epoch, **_only(final, "validation_")}, step)
            if (every and step % every == 0) or (not every and epoch_done):
                _save_checkpoint(ctx, runner, optimizer, ranges, step, step // steps_per_epoch)
                checkpointed_at = step
            if step >= last_step:
                break
    elapsed = time.monotonic() - started
    if step > first_step:
        ctx.log(f"trained steps {first_step + 1}..{step} in {elapsed:.2f}s ({(step - first_step) / max(elapsed, 1e-9):.1f} steps/s)")
    if checkpointed_at != step and step > first_step:
        _save_checkpoint(ctx, runner, optimizer, ranges, step, step // steps_per_epoch)
    if task.validation is not None and evaluated_at != step:
        final.update(_evaluate(ctx, runner, task.validation, "validation"))
        ctx.logger.log(_only(final, "validation_"), step)
    if task.test is not None:
        final.update(_evaluate(ctx, runner, task.test, "test"))
        ctx.logger.log(_only(final, "test_"), step)
    final["step"] = step

    # 4. Measured times and the whole model, on rank 0.
    stage_pieces = _gather_on_main(ctx, {"ms": runner.clock.ms_per_step, "notes": runner.notes,
                                         "model": module.state_dict()})
    weights: dict[str, torch.Tensor] = {}
    if stage_pieces is not None:
        measured = [piece["ms"] for piece in stage_pieces]
        notes = plan.notes + sorted({note for piece in stage_pieces for note in piece["notes"]})
        report.write("partition", _report(settings, plan, names, measured if None not in measured else None, notes))
        for piece in stage_pieces:
            weights.update(piece["model"])
        if None not in measured:
            ctx.log("pipeline stages, measured forward+backward ms per step: "
                    + ", ".join(f"{value:.2f}" for value in measured) + f" (balance {balance(measured):.3f})")
    return final, weights


def _only(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {name: value for name, value in metrics.items() if name.startswith(prefix)}
