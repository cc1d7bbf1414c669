"""A small classifier trained with data parallelism: every process holds the whole model and
sees its own share of each epoch; DDP averages the gradients.

Runs unchanged as one process, under DDP, FSDP or a pipeline: `trainyard.parallel.wrap`
follows the job's `distribution`. Data: the CSV files of the `train` channel (numeric
feature columns, the label in the last column), or, without a channel, two noisy
interleaved spirals made here.

    trainyard run examples/ddp_classifier/train.py --distribution ddp --processes-per-node 2 --follow
"""

import argparse
import csv
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainyard.parallel as tp
from trainyard import log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", "--batch_size", type=int, default=64)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
args, _ = parser.parse_known_args()


def spirals(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (count,), generator=generator)
    radius = torch.rand(count, generator=generator) * 3 + 0.2
    angle = radius * 2.5 + labels * math.pi
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return points + 0.1 * torch.randn(count, 2, generator=generator), labels


def read_csv(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for path in sorted(folder.rglob("*.csv")):
        with open(path, newline="") as source:
            reader = csv.reader(source)
            next(reader)  # the header
            rows += [[float(value) for value in row] for row in reader if row]
    table = torch.tensor(rows)
    return table[:, :-1], table[:, -1].long()


class Classifier(nn.Module):
    def __init__(self, features: int, classes: int, hidden: int) -> None:
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.hidden = nn.Sequential(nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.output = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.hidden(self.input(x)))


ctx = tp.init(seed=args.seed)
channel = os.environ.get("SM_CHANNEL_TRAIN")
features, labels = read_csv(Path(channel)) if channel else spirals(2048, args.seed)
data = TensorDataset(features, labels)
model = tp.wrap(Classifier(features.shape[1], int(labels.max()) + 1, args.hidden), loss_fn=F.cross_entropy)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
sampler = DistributedSampler(data, num_replicas=ctx.replicas, rank=ctx.replica, seed=args.seed)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

step = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = model.step(inputs, targets)
        optimizer.step()
        step += 1
        if step % 10 == 0:
            mean = ctx.mean(loss)  # every rank's loss, averaged
            if ctx.is_main:
                log_metric("train_loss", mean, step)
    correct = sum(int((model.predict(inputs).argmax(1) == targets).sum()) for inputs, targets in loader)
    accuracy = ctx.mean(correct / (len(loader) * args.batch_size))
    if ctx.is_main:
        log_metric("train_accuracy", accuracy, step)
        print(f"epoch {epoch + 1}: train_loss={float(loss):.4f} train_accuracy={accuracy:.4f}", flush=True)

model.measured()  # each rank's peak memory (and a pipeline's stage times) into the job's reports
weights = tp.model_state(model)  # the whole model on rank 0 (every rank takes part)
if ctx.is_main:
    torch.save(weights, Path(os.environ.get("SM_MODEL_DIR", ".")) / "model.pt")
tp.destroy()
