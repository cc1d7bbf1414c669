"""Trains step by step: logs `loss` through the SDK every step, checkpoints every
--every steps into SM_CHECKPOINT_DIR with trainyard.checkpoints, resumes from the newest
one and says where: "resumed from checkpoint step N" then "first step S"."""

import argparse
import os
import time

from trainyard import checkpoints
from trainyard.metrics import flush, log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--every", type=int, default=5)
parser.add_argument("--delay", type=float, default=0.2)
args, _ = parser.parse_known_args()
folder = os.environ["SM_CHECKPOINT_DIR"]
step, weight = 0, 1.0
latest = checkpoints.latest_checkpoint(folder)
if latest is not None:
    state = checkpoints.load_checkpoint(latest[1])
    step, weight = state["step"], state["weight"]
    print(f"resumed from checkpoint step {step}", flush=True)
first = True
while step < args.steps:
    step += 1
    weight *= 0.95
    if first:
        print(f"first step {step} attempt {os.environ.get('TRAINYARD_ATTEMPT')}", flush=True)
        first = False
    log_metric("loss", weight, step)
    if step % args.every == 0:
        checkpoints.save_checkpoint({"step": step, "weight": weight}, step, folder)
    time.sleep(args.delay)
flush()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weight.txt"), "w") as out:
    out.write(f"{weight} {step}")
