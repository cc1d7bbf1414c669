"""Logs a loss curve through the SDK, one point per --delay seconds, checkpointing every
--every steps; the shape is chosen by --shape:
- nan: 0.95**step until --at, then NaN (a diverged run) and on for --steps;
- sleep: --at steps, then silent (no point, no log line) for --sleep seconds;
- series: the values of --values (comma-separated), one per step.
--via print: the loss is only printed ("step N loss X", for the job's metric_definitions),
never sent through the SDK."""

import argparse
import os
import time

from trainyard import checkpoints
from trainyard.metrics import flush, log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--shape", default="nan")
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--at", type=int, default=10)
parser.add_argument("--every", type=int, default=1)
parser.add_argument("--delay", type=float, default=0.2)
parser.add_argument("--sleep", type=float, default=120.0)
parser.add_argument("--values", default="")
parser.add_argument("--via", default="sdk", choices=["sdk", "print"])
args, _ = parser.parse_known_args()
folder = os.environ["SM_CHECKPOINT_DIR"]
values = [float(v) for v in args.values.split(",") if v] if args.shape == "series" else []
steps = len(values) if values else args.steps
for step in range(1, steps + 1):
    if args.shape == "series":
        loss = values[step - 1]
    elif args.shape == "nan" and step >= args.at:
        loss = float("nan")
    else:
        loss = 0.95 ** step
    if args.via == "sdk":
        log_metric("loss", loss, step)
    print(f"step {step} loss {loss}", flush=True)
    if step % args.every == 0:
        checkpoints.save_checkpoint({"step": step}, step, folder)
    if args.shape == "sleep" and step == args.at:
        flush()
        time.sleep(args.sleep)
    time.sleep(args.delay)
flush()
with open(os.path.join(os.environ["SM_MODEL_DIR"], "done.txt"), "w") as out:
    out.write(str(steps))
