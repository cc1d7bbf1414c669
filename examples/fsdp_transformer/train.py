"""A small transformer language model trained sharded: FSDP2 splits its parameters,
gradients and optimizer state over the processes, and the checkpoints are sharded too
(each process writes its own part), so a job that loses a node resumes where its last
checkpoint left it, also on a different number of processes.

Runs unchanged as one process, under DDP, FSDP or a pipeline (`trainyard.parallel.wrap`
follows the job's `distribution`). Data: the text files of the `train` channel, or, without
one, a text made here.

    trainyard run examples/fsdp_transformer/train.py --distribution fsdp --processes-per-node 2 --follow
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import trainyard.parallel as tp
from trainyard import log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch-size", "--batch_size", type=int, default=16)
parser.add_argument("--context", type=int, default=32)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--checkpoint-every", "--checkpoint_every", type=int, default=10)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--delay", type=float, default=0.0)  # seconds per step, to watch it (or kill it) mid-run
args, _ = parser.parse_known_args()


def read_text() -> str:
    channel = os.environ.get("SM_CHANNEL_TRAIN")
    if channel:
        return "".join(path.read_text(errors="replace") for path in sorted(Path(channel).rglob("*")) if path.is_file())
    return "".join(f"the {word} fox jumps over the lazy dog {number}.\n"
                   for number in range(400) for word in ("quick", "brown", "sly")[number % 3:number % 3 + 1])


class Block(nn.Module):
    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.feed_forward = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device), diagonal=1)
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.feed_forward(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, vocabulary: int, width: int, layers: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.zeros(1, context, width))
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


ctx = tp.init(seed=args.seed)
text = read_text()
vocabulary = sorted(set(text))
encoded = torch.tensor([vocabulary.index(character) for character in text])
windows = encoded.unfold(0, args.context + 1, 1)  # (count, context + 1)
model = tp.wrap(LanguageModel(len(vocabulary), args.width, args.layers, args.context), loss_fn=lm_loss)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

state = {"model": model, "optimizer": optimizer}
step = first = tp.load(state) or 0  # the newest whole sharded checkpoint in SM_CHECKPOINT_DIR, if any
if step and ctx.is_main:
    print(f"resumed from checkpoint step {step}", flush=True)


def batch_for(step: int) -> torch.Tensor:
    """The windows of a step: the same on a resumed run as on an uninterrupted one. Each
    replica takes its own share of the batch."""
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(args.seed + step))
    chosen = windows[order[: args.batch_size]]
    return chosen[ctx.replica::ctx.replicas]


while step < args.steps:
    step += 1
    chosen = batch_for(step)
    optimizer.zero_grad()
    loss = model.step(chosen[:, :-1], chosen[:, 1:])
    optimizer.step()
    mean = ctx.mean(loss)
    if ctx.is_main:
        log_metric("train_loss", mean, step)
    if step % args.checkpoint_every == 0 or step == args.steps:
        tp.save({"model": model, "optimizer": optimizer}, step)
    time.sleep(args.delay)

if ctx.is_main and step > first:
    print(f"trained {step} steps: train_loss={mean:.4f}", flush=True)
model.measured()  # each rank's peak memory (and a pipeline's stage times) into the job's reports
weights = tp.model_state(model)
if ctx.is_main:
    torch.save({"vocabulary": vocabulary, "weights": weights}, Path(os.environ.get("SM_MODEL_DIR", ".")) / "model.pt")
tp.destroy()
