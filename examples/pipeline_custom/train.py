"""A model cut into pipeline stages that is not a plain list of layers: a stem, a stack of
residual blocks of different widths, and a head that also reads the stem's output (a skip
connection across every cut). `trainyard.parallel.wrap` traces it with torch.export, the
partitioner times each block and chooses the cuts that balance the stages, and
torch.distributed.pipelining runs the stages, each batch in microbatches; the loss is the
same as one process's.

Runs unchanged as one process, under DDP, FSDP or a pipeline. Data: made here, a noisy
function of 16 inputs to predict (regression), or the CSV files of the `train` channel
(numeric columns, the target last).

    trainyard run examples/pipeline_custom/train.py --distribution pipeline --processes-per-node 2 --follow
"""

import argparse
import csv
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import trainyard.parallel as tp
from trainyard import log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", "--batch_size", type=int, default=64)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--microbatches", type=int, default=4)
parser.add_argument("--seed", type=int, default=0)
args, _ = parser.parse_known_args()


def made_up(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 16, generator=generator)
    y = torch.sin(x[:, :4].sum(1, keepdim=True)) + 0.5 * x[:, 4:8].prod(1, keepdim=True).tanh()
    return x, y + 0.05 * torch.randn(count, 1, generator=generator)


def read_csv(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for path in sorted(folder.rglob("*.csv")):
        with open(path, newline="") as source:
            reader = csv.reader(source)
            next(reader)
            rows += [[float(value) for value in row] for row in reader if row]
    table = torch.tensor(rows)
    return table[:, :-1], table[:, -1:]


class Residual(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class SkipNet(nn.Module):
    def __init__(self, features: int, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.body = nn.ModuleList(Residual(width, hidden) for hidden in (64, 256, 64, 128, 512, 64, 256, 128))
        self.head = nn.Linear(2 * width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stem = self.stem(x)
        h = stem
        for block in self.body:
            h = block(h)
        return self.head(torch.cat([h, stem], dim=-1))  # the stem's output crosses every cut


ctx = tp.init(seed=args.seed)
channel = os.environ.get("SM_CHANNEL_TRAIN")
inputs, targets = read_csv(Path(channel)) if channel else made_up(4096, args.seed)
model = tp.wrap(SkipNet(inputs.shape[1]), loss_fn=F.mse_loss, microbatches=args.microbatches)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(1, args.steps + 1):
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(args.seed + step))[: args.batch_size]
    mine = order[ctx.replica::ctx.replicas]  # each replica its share; a pipeline's stages the same share
    optimizer.zero_grad()
    loss = model.step(inputs[mine], targets[mine])
    optimizer.step()
    mean = ctx.mean(loss)
    if ctx.is_main:
        log_metric("train_loss", mean, step)

model.measured()  # each rank's peak memory (and a pipeline's stage times) into the job's reports
if ctx.is_main:
    print(f"trained {args.steps} steps: train_loss={mean:.6f}", flush=True)
weights = tp.model_state(model)
if ctx.is_main:
    torch.save(weights, Path(os.environ.get("SM_MODEL_DIR", ".")) / "model.pt")
tp.destroy()
