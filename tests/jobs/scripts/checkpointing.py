"""Trains step by step, checkpointing every step into SM_CHECKPOINT_DIR (written under a
dot-name, then renamed, newest two kept) and resuming from the newest checkpoint it finds."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--delay", type=float, default=0.1)
args, _ = parser.parse_known_args()
folder = os.environ["SM_CHECKPOINT_DIR"]
found = sorted(int(name[len("checkpoint-"):-len(".json")]) for name in os.listdir(folder)
               if name.startswith("checkpoint-") and name.endswith(".json"))
step, weight = 0, 1.0
if found:
    with open(os.path.join(folder, f"checkpoint-{found[-1]:06d}.json")) as handle:
        state = json.load(handle)
    step, weight = state["step"], state["weight"]
    print(f"resumed from checkpoint step {step}", flush=True)
while step < args.steps:
    step += 1
    weight *= 0.9
    print(f"step={step} loss={weight:.5f}", flush=True)
    temporary = os.path.join(folder, f".checkpoint-{step:06d}.json.tmp")
    with open(temporary, "w") as out:
        json.dump({"step": step, "weight": weight}, out)
    os.replace(temporary, os.path.join(folder, f"checkpoint-{step:06d}.json"))
    for old in sorted(n for n in os.listdir(folder) if n.startswith("checkpoint-"))[:-2]:
        os.remove(os.path.join(folder, old))
    time.sleep(args.delay)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "weight.json"), "w") as out:
    json.dump({"weight": weight, "step": step}, out)
