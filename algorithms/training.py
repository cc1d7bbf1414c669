"""The deterministic, resumable training loop of the built-in algorithms (fit): resume from
the newest checkpoint, train epoch by epoch over the seeded order, evaluate, checkpoint,
stop at max_steps. How the model is spread over processes is the strategy's
(trainyard.parallel.replicated by default, trainyard.parallel.fsdp when sharded).

Imports torch at the top: only training processes import this module.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from algorithms.process import Context
from trainyard import checkpoints
from trainyard.errors import DataError
from trainyard.parallel.context import Context as Processes
from trainyard.parallel.replicated import Replicated
from trainyard.parallel.steps import EVAL_BATCH_SIZE, Task, TensorBatches, epoch_batches, plan_steps, restore_rng, rng_state


@torch.no_grad()
def evaluate(task: Task, model: nn.Module, data: TensorBatches, prefix: str, dist: Processes, *,
             lockstep: bool = False) -> dict[str, float]:
    """Every rank scores its own stride of the data (no padding, so no record counts twice);
    sums are added over ranks, so every rank reports the same, global, figures. With
    lockstep every rank runs the same number of forwards (a sharded model all-gathers its
    weights in each), a rank that has run out scoring record 0 without counting it."""
    was_training = model.training
    model.eval()
    loss_sum = correct = count = 0.0
    mine = list(range(dist.rank, len(data), dist.world_size))
    chunks = [mine[start:start + EVAL_BATCH_SIZE] for start in range(0, len(mine), EVAL_BATCH_SIZE)]
    if lockstep:
        most = math.ceil(math.ceil(len(data) / dist.world_size) / EVAL_BATCH_SIZE)
        chunks += [[]] * (most - len(chunks))
    for chunk in chunks:
        batch = tuple(tensor.to(dist.device) for tensor in data[chunk or [0]])
        logits = model(*batch[:-1])
        if not chunk:
            continue
        flat_logits, targets = logits.reshape(-1, logits.shape[-1]), batch[-1].reshape(-1)
        loss_sum += F.cross_entropy(flat_logits, targets, reduction="sum").item()
        correct += (flat_logits.argmax(dim=-1) == targets).sum().item()
        count += targets.numel()
    loss_sum, correct, count = dist.sum([loss_sum, correct, count])
    model.train(was_training)
    loss = loss_sum / max(count, 1.0)
    if task.report == "perplexity":
        return {f"{prefix}_loss": loss, f"{prefix}_perplexity": math.exp(min(loss, 50.0))}
    return {f"{prefix}_loss": loss, f"{prefix}_accuracy": correct / max(count, 1.0)}


def _resume(ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer, strategy: Replicated) -> int:
    """The step of the newest readable checkpoint, its state loaded into model, optimizer
    and RNGs; 0 when there is none. An unreadable newest file (a sync cut short) falls
    back to the one before it."""
    for step, path, state in checkpoints.readable_checkpoints(ctx.env.checkpoint_dir, ctx.spec.name):
        try:
            strategy.load(model, optimizer, state["model"], state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise DataError(f"checkpoint {path.name} does not fit this model (were the data or the architecture "
                            f"hyperparameters changed?): {str(exc).splitlines()[0]}") from None
        restore_rng(state["rng"])
        ctx.log(f"resumed from checkpoint step {step}")
        return step
    return 0


def _save_checkpoint(ctx: Context, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, epoch: int,
                     strategy: Replicated) -> None:
    if not (ctx.dist.is_main or strategy.collective_state):
        return
    model_state, optimizer_state = strategy.model_state(model), strategy.optimizer_state(model, optimizer)
    if not ctx.dist.is_main:
        return
    state = {"algorithm": ctx.spec.name, "step": step, "epoch": epoch, "model": model_state,
             "optimizer": optimizer_state, "rng": rng_state()}
    path = checkpoints.save_checkpoint(state, step, ctx.env.checkpoint_dir)
    ctx.log(f"saved checkpoint {path.name} at step {step}")


def fit(ctx: Context, task: Task, strategy: Replicated | None = None) -> dict[str, float]:
    """1. Resume from the newest checkpoint, if any. 2. Train epoch by epoch: each epoch's
    order comes from DistributedSampler(seed, epoch) alone, so a resumed run skips the
    batches already done and sees exactly what an uninterrupted run would. 3. Evaluate
    after each epoch, checkpoint on schedule, stop at max_steps. Returns final metrics."""
    hps, dist = ctx.hps, ctx.dist
    strategy = strategy or Replicated()
    model = strategy.prepare(task.model, dist)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hps["learning_rate"], weight_decay=hps["weight_decay"])
    step = _resume(ctx, model, optimizer, strategy)
    trained = strategy.wrap(model, dist)
    lockstep = strategy.eval_in_lockstep
    sampler, steps_per_epoch, last_step = plan_steps(ctx, task, step, replicas=dist.world_size, rank=dist.rank)
    every = ctx.env.checkpoint_every_steps
    final: dict[str, float] = {}
    evaluated_at = checkpointed_at = -1
    loss_total: torch.Tensor | float = 0.0
    loss_count = 0
    started, first_step = time.monotonic(), step
    model.train()
    while step < last_step:
        for batch in epoch_batches(ctx, task, sampler, step, steps_per_epoch):
            step += 1
            optimizer.zero_grad(set_to_none=True)
            loss = trained.step(tuple(batch[:-1]), batch[-1])  # forward, cross-entropy, backward
            optimizer.step()
            # Summed on the device and read only when reported: .item() every step would
            # make a GPU wait for each step to finish.
            loss_total = loss_total + loss.detach()
            loss_count += 1
            if step % hps["log_every_steps"] == 0 or step == last_step:
                final["train_loss"] = float(loss_total) / loss_count
                ctx.logger.log({"train_loss": final["train_loss"]}, step)
                loss_total, loss_count = 0.0, 0
            epoch_done = step % steps_per_epoch == 0
            if epoch_done:
                if task.validation is not None:
                    final.update(evaluate(task, model, task.validation, "validation", dist, lockstep=lockstep))
                    evaluated_at = step
                ctx.logger.log({"epoch": step // steps_per_epoch, **_only(final, "validation_")}, step)
            if (every and step % every == 0) or (not every and epoch_done):
                _save_checkpoint(ctx, model, optimizer, step, step // steps_per_epoch, strategy)
                checkpointed_at = step
            if step >= last_step:
                break
    elapsed = time.monotonic() - started
    if step > first_step:
        ctx.log(f"trained steps {first_step + 1}..{step} in {elapsed:.2f}s ({(step - first_step) / max(elapsed, 1e-9):.1f} steps/s)")
    if checkpointed_at != step and step > first_step:
        _save_checkpoint(ctx, model, optimizer, step, step // steps_per_epoch, strategy)
    if task.validation is not None and evaluated_at != step:
        final.update(evaluate(task, model, task.validation, "validation", dist, lockstep=lockstep))
        ctx.logger.log(_only(final, "validation_"), step)
    if task.test is not None:
        final.update(evaluate(task, model, task.test, "test", dist, lockstep=lockstep))
        ctx.logger.log(_only(final, "test_"), step)
    final["step"] = step
    return final


def _only(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {name: value for name, value in metrics.items() if name.startswith(prefix)}
