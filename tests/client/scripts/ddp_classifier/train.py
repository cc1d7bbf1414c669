"""A small DDP classifier a user would submit with `trainyard run`: it imports a module of
its own folder (so the folder, not only this file, must have been sent), logs its loss
through the SDK, and prints the files of its working directory (what the client packed)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from helpers import make_batch
from torch import nn

from trainyard import log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.1)
args, _ = parser.parse_known_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for step in range(1, args.steps + 1):
    features, labels = make_batch(seed=step * 10 + rank)
    loss = nn.functional.cross_entropy(model(features), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        log_metric("loss", loss.item(), step)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.05)
if rank == 0:
    sent = sorted(os.path.relpath(os.path.join(folder, name)) for folder, _, names in os.walk(".") for name in names
                  if "__pycache__" not in folder)  # written by this run's own imports
    print(f"sent files: {' '.join(sent)}", flush=True)
    print(f"world size {dist.get_world_size()}", flush=True)
    torch.save(model.module.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
dist.barrier()
dist.destroy_process_group()
