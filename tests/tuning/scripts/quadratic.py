"""A cheap synthetic objective for tuning tests and benchmarks: at each step it logs

    loss = (x - 1)² + (y + 2)² + 1 / (step + 1)

(best at x = 1, y = -2), so a trial's final loss is a known function of its
hyperparameters. `--steps` steps; each step sleeps `--step_seconds` × loss, so a bad
configuration trains slowly, like a diverging run, and a pruner has time to stop it.
Hyperparameters arrive as `--name value` arguments (SageMaker's script mode)."""

from __future__ import annotations

import argparse
import os
import time

from trainyard import flush, log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--x", type=float, default=0.0)
parser.add_argument("--y", type=float, default=0.0)
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step_seconds", type=float, default=0.0)
args, _ = parser.parse_known_args()

target = (args.x - 1) ** 2 + (args.y + 2) ** 2
for step in range(args.steps):
    loss = target + 1 / (step + 1)
    log_metric("loss", loss, step)
    print(f"step={step} loss={loss:.6f}", flush=True)
    if args.step_seconds:
        flush()  # the pruner sees each step as it happens
        time.sleep(args.step_seconds * loss)

with open(os.path.join(os.environ["SM_MODEL_DIR"], "result.txt"), "w") as out:
    out.write(f"{target}\n")
