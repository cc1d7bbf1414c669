"""resumable.py over torch.distributed: every step all-reduces across the ranks (so a rank
whose peer dies fails at once, as real DDP does); rank 0 logs and checkpoints."""

import argparse
import os
import time

import torch
import torch.distributed as dist

from trainyard import checkpoints
from trainyard.metrics import flush, log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--every", type=int, default=5)
parser.add_argument("--delay", type=float, default=0.2)
args, _ = parser.parse_known_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
folder = os.environ["SM_CHECKPOINT_DIR"]
step, weight = 0, 1.0
latest = checkpoints.latest_checkpoint(folder) if rank == 0 else None
state = torch.tensor([latest[0] if latest else 0], dtype=torch.int64)
dist.broadcast(state, 0)
if int(state.item()):
    step = int(state.item())
    weight = 0.95 ** step
    print(f"resumed from checkpoint step {step}", flush=True)
while step < args.steps:
    step += 1
    total = torch.ones(1)
    dist.all_reduce(total)
    weight *= 0.95
    if rank == 0:
        log_metric("loss", weight, step)
        if step % args.every == 0:
            checkpoints.save_checkpoint({"step": step}, step, folder)
    time.sleep(args.delay)
flush()
if rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "weight.txt"), "w") as out:
        out.write(f"{weight} {step} world {int(total.item())}")
dist.barrier()
dist.destroy_process_group()
