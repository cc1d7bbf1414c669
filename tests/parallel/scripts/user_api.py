"""A user's training script for tests/parallel/test_user_api.py, launched by torch.distributed.run
under whatever TRAINYARD_DISTRIBUTION the test sets:

    python -m torch.distributed.run --standalone --nproc-per-node 2 user_api.py \
        '[{"check": "train", "save_at": 3, "save_to": "..."}, {"check": "resume", "as": "resume_fsdp", ...}]'

It runs the checks one after another in the same process group, each with its options,
and prints, from rank 0, one line `RESULT <json>`: the check's name ("as", else "check") →
what it found (or {"error": traceback}).
Every rank runs every check, so a check that fails fails the same way on every rank and the
next one still runs.

Every batch depends only on its step, so any distribution sees the same data: a data
parallel replica takes its share of the batch, the stages of a pipeline the replica's share.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

import trainyard.parallel as tp
from trainyard.errors import DataError

# What a check may raise and the next check still run after: DCP's CheckpointException is
# a BaseException.
FAILURES = (Exception, CheckpointException)
BATCH = 8
STEPS = 6
VOCABULARY, POSITIONS, CLASSES, FEATURES = 24, 6, 5, 12
LEARNING_RATE, MOMENTUM = 0.05, 0.9


# --- the models --------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, dim: int, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, width)
        self.down = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    """Not a Sequential: an embedding, residual blocks of uneven widths in a ModuleList, a
    mean over positions and a head."""

    def __init__(self, dim: int = 16, widths: tuple[int, ...] = (8, 48, 16, 96)) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, dim)
        self.blocks = nn.ModuleList(Block(dim, width) for width in widths)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x.mean(dim=1))


class Branchy(Net):
    """Branches in Python on a tensor's value: torch.export cannot trace it."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if x.sum() > 0:
            x = x + self.blocks[0](x)
        for block in self.blocks[1:]:
            x = x + block(x)
        return self.head(x.mean(dim=1))


def branch_line() -> str:
    """file:line of Branchy's `if` on a tensor's value."""
    lines, first = inspect.getsourcelines(Branchy.forward)
    offset = next(index for index, line in enumerate(lines) if "if x.sum() > 0" in line)
    return f"{inspect.getsourcefile(Branchy)}:{first + offset}"


def sequential() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 24), nn.Tanh(), nn.Linear(24, CLASSES))


# --- data --------------------------------------------------------------------------------------
def batch(step: int, kind: str = "ids") -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of a step (the same on every rank)."""
    generator = torch.Generator().manual_seed(1000 + step)
    inputs = (torch.randint(0, VOCABULARY, (BATCH, POSITIONS), generator=generator) if kind == "ids"
              else torch.randn(BATCH, FEATURES, generator=generator))
    return inputs, torch.randint(0, CLASSES, (BATCH,), generator=generator)


def share(ctx: tp.Context, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's equal share of a batch."""
    size = len(targets) // ctx.replicas
    part = slice(ctx.replica * size, (ctx.replica + 1) * size)
    return inputs[part], targets[part]


# --- training ------------------------------------------------------------------------------------
def build(ctx: tp.Context, make: Callable[[], nn.Module], wrapper: Callable[..., tp.Parallel] | None = None,
          **options: Any) -> tuple[tp.Parallel, torch.optim.Optimizer]:
    tp.init(seed=0)  # the same initial model on every rank
    model = (wrapper or tp.wrap)(make(), loss_fn=F.cross_entropy, **options)
    return model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)


def train(ctx: tp.Context, model: tp.Parallel, optimizer: torch.optim.Optimizer, steps: range, kind: str = "ids",
          save_at: int | None = None, directory: str | None = None) -> list[float]:
    """The mean loss over the whole batch of each step."""
    losses = []
    for step in steps:
        optimizer.zero_grad()
        loss = model.step(*share(ctx, *batch(step, kind)))
        optimizer.step()
        losses.append(ctx.mean(loss))
        if step == save_at:
            tp.save({"model": model, "optimizer": optimizer, "epoch": step * 10}, step, directory=directory)
    return losses


def gradients(model: tp.Parallel) -> dict[str, torch.Tensor]:
    """This process's gradients by parameter name (a sharded one: its shard)."""
    found = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad
            found[name] = (grad.to_local() if hasattr(grad, "to_local") else grad).detach().clone()
    return found


def largest_difference(ctx: tp.Context, first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys() and first, (sorted(first), sorted(second))
    mine = max(float((first[name] - second[name]).abs().max()) for name in first)
    everyone: list[Any] = [None] * ctx.world_size
    if ctx.world_size > 1:
        torch.distributed.all_gather_object(everyone, mine)
        return max(everyone)
    return mine


def steps_from(first: int) -> range:
    return range(first, STEPS + 1)


# --- checks ----------------------------------------------------------------------------------------
def check_train(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """The custom model as the job's distribution says; saved at step save_at when asked."""
    model, optimizer = build(ctx, Net)
    directory = config.get("save_to")
    losses = train(ctx, model, optimizer, steps_from(1), save_at=config.get("save_at"), directory=directory)
    found: dict[str, Any] = {"losses": losses, "kind": model.kind, "report": model.report,
                             "evaluation": ctx.mean(model.evaluate(*share(ctx, *batch(0))))}
    if isinstance(model, tp.Pipelined):
        found["measured"] = model.measured()
    if directory and ctx.is_main:
        found["files"] = {entry.name: sorted(item.name for item in entry.iterdir()) if entry.is_dir() else None
                          for entry in Path(directory).iterdir()}
    return found


def check_resume(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """Load the newest checkpoint in resume_from and train the steps after it."""
    model, optimizer = build(ctx, Net)
    items: dict[str, Any] = {"model": model, "optimizer": optimizer, "epoch": -1}
    step = tp.load(items, directory=config["resume_from"])
    assert step is not None, f"no checkpoint in {config['resume_from']}"
    return {"step": step, "epoch": items["epoch"], "losses": train(ctx, model, optimizer, steps_from(step + 1))}


def check_resume_without_hidden_metadata(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """As a restore from the agent's sync leaves it: the step folders without `.metadata`."""
    copy = Path(config["scratch"]) / "synced"
    if ctx.is_main:
        shutil.copytree(config["resume_from"], copy)
        for hidden in copy.glob("step-*/.metadata"):
            hidden.unlink()
    ctx.barrier()
    before = sorted(item.name for item in next(copy.glob("step-*")).iterdir())
    found = check_resume(ctx, {"resume_from": str(copy)})
    return {**found, "before": before}


def check_empty(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    model, optimizer = build(ctx, Net)
    empty = Path(config["scratch"]) / "empty"
    return {"step": tp.load({"model": model, "optimizer": optimizer}, directory=empty)}


def check_wrong_architecture(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """Checkpoints of Net loaded into other models: one width changed, one block added, one
    block fewer."""
    found = {}
    for name, make in (("wider", lambda: Net(dim=20)), ("deeper", lambda: Net(widths=(8, 48, 16, 96, 8))),
                       ("shallower", lambda: Net(widths=(8, 48, 16)))):
        model, optimizer = build(ctx, make)
        try:
            step = tp.load({"model": model, "optimizer": optimizer}, directory=config["resume_from"])
        except DataError as exc:
            found[name] = {"error_type": "DataError", "message": str(exc)}
        except FAILURES as exc:
            found[name] = {"error_type": type(exc).__name__, "message": str(exc)[:500]}
        else:
            found[name] = {"loaded_step": step}
    return found


def check_sequential(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """An nn.Sequential: under a pipeline in each partition and schedule given, else as wrap says."""
    found = {}
    for variant in config.get("variants") or [{}]:
        name = json.dumps(variant, sort_keys=True)
        if variant:
            model, optimizer = build(ctx, sequential, tp.pipeline, stages=2, microbatches=4, **variant)
        else:
            model, optimizer = build(ctx, sequential)
        losses = train(ctx, model, optimizer, steps_from(1), kind="features")
        found[name] = {"losses": losses, "report": model.report}
    return found


def check_shard_options(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """The explicit FSDP form with each option: its losses and what it reports."""
    found = {}
    for name, options in (("cpu_offload", {"cpu_offload": True}), ("bf16", {"mixed_precision": "bf16"})):
        model, optimizer = build(ctx, Net, tp.shard, **options)
        found[name] = {"losses": train(ctx, model, optimizer, steps_from(1)), "report": model.report}
    return found


def check_accumulation(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """The same batch in one piece and in 4 accumulated chunks."""
    inputs, targets = share(ctx, *batch(1))
    results = {}
    for chunks in (1, 4):
        model, _ = build(ctx, Net, gradient_accumulation=chunks)
        loss = model.step(inputs, targets)
        results[chunks] = (ctx.mean(loss), gradients(model))
    return {"losses": [results[1][0], results[4][0]],
            "largest_difference": largest_difference(ctx, results[1][1], results[4][1])}


def check_activation_checkpointing(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """One step with and without; `calls`: how often a layer inside a block ran in the step
    (twice where backward recomputed it)."""
    inputs, targets = share(ctx, *batch(2))
    results = {}
    notes = None
    for enabled in (False, True):
        model, _ = build(ctx, Net, checkpoint_activations=enabled)
        calls: list[int] = []
        model.model.blocks[1].up.register_forward_hook(lambda *_, seen=calls: seen.append(1))
        loss = model.step(inputs, targets)
        results[enabled] = (ctx.mean(loss), gradients(model), len(calls))
        if enabled:
            notes = model.report.get("activation_checkpointing")
    return {"losses": [results[False][0], results[True][0]], "blocks": notes,
            "calls": [results[False][2], results[True][2]],
            "largest_difference": largest_difference(ctx, results[False][1], results[True][1])}


def check_untraceable(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    model, optimizer = build(ctx, Branchy)
    try:
        train(ctx, model, optimizer, range(1, 2))
    except DataError as exc:
        return {"error_type": "DataError", "message": str(exc), "where": branch_line()}
    except FAILURES as exc:
        return {"error_type": type(exc).__name__, "message": str(exc)[:2000], "where": branch_line()}
    return {"error_type": None, "where": branch_line()}


def check_context(ctx: tp.Context, config: dict[str, Any]) -> dict[str, Any]:
    """init() again gives the same Context (and reseeds); every rank's place in the job."""
    again = tp.init()
    reseeded = tp.init(seed=3)
    draw = torch.rand(4)
    torch.manual_seed(3)
    mine = {"rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank, "stages": ctx.stages,
            "replicas": ctx.replicas, "replica": ctx.replica, "stage": ctx.stage, "is_main": ctx.is_main,
            "backend": ctx.backend, "same": again is ctx and reseeded is ctx and tp.current() is ctx,
            "reseeded": bool(torch.equal(draw, torch.rand(4))),
            "initialised": torch.distributed.is_available() and torch.distributed.is_initialized()}
    everyone: list[Any] = [mine]
    if ctx.world_size > 1:
        everyone = [None] * ctx.world_size
        torch.distributed.all_gather_object(everyone, mine)
    return {"ranks": everyone}


CHECKS: dict[str, Callable[[tp.Context, dict[str, Any]], dict[str, Any]]] = {
    "train": check_train, "resume": check_resume, "resume_without_hidden_metadata": check_resume_without_hidden_metadata,
    "empty": check_empty, "wrong_architecture": check_wrong_architecture, "sequential": check_sequential,
    "accumulation": check_accumulation, "activation_checkpointing": check_activation_checkpointing,
    "untraceable": check_untraceable, "context": check_context, "shard_options": check_shard_options,
}


def main() -> None:
    checks = json.loads(sys.argv[1])
    ctx = tp.init(seed=0)
    results: dict[str, Any] = {}
    for config in checks:
        name = config.get("as", config["check"])
        # Each check's reports in its own folder (rank 0 writes them), when the test asks.
        os.environ.pop("TRAINYARD_REPORT_DIR", None)
        if config.get("reports"):
            os.environ["TRAINYARD_REPORT_DIR"] = config["reports"]
        try:
            results[name] = CHECKS[config["check"]](ctx, config)
        except FAILURES:
            results[name] = {"error": traceback.format_exc()}
        ctx.barrier()
    if ctx.is_main:
        sys.stdout.write("RESULT " + json.dumps(results) + "\n")
        sys.stdout.flush()
    tp.destroy()


if __name__ == "__main__":
    main()
