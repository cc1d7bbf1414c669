"""A SageMaker script-mode training script, unchanged: hyperparameters as arguments and in
SM_HPS, data from SM_CHANNEL_TRAIN, the model into SM_MODEL_DIR, `loss=` lines on stdout.

Fits y = w·x + b by gradient descent in plain Python (no torch: the test is about the
contract, not the maths). Also records what it saw for the test to check: its environment
and the job directory's layout, in SM_OUTPUT_DATA_DIR.
"""

import argparse
import csv
import glob
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--learning-rate", "--learning_rate", type=float, default=0.05)
parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR"))
parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN"))
args, _unknown = parser.parse_known_args()
hps = json.loads(os.environ["SM_HPS"])
assert hps["epochs"] == args.epochs, (hps, args)

rows = []
for path in sorted(glob.glob(os.path.join(args.train, "**", "*.csv"), recursive=True)):
    with open(path, newline="") as handle:
        rows += [(float(r["x"]), float(r["y"])) for r in csv.DictReader(handle)]
print(f"read {len(rows)} rows from {args.train}", flush=True)

w = b = 0.0
for epoch in range(args.epochs):
    grad_w = sum(2 * (w * x + b - y) * x for x, y in rows) / len(rows)
    grad_b = sum(2 * (w * x + b - y) for x, y in rows) / len(rows)
    w -= args.learning_rate * grad_w
    b -= args.learning_rate * grad_b
    loss = sum((w * x + b - y) ** 2 for x, y in rows) / len(rows)
    print(f"epoch={epoch} loss={loss:.4f}", flush=True)

with open(os.path.join(args.model_dir, "model.json"), "w") as out:
    json.dump({"w": w, "b": b}, out)

base = os.path.dirname(os.environ["SM_MODEL_DIR"])
layout = sorted(os.path.relpath(os.path.join(d, name), base) for d, dirs, files in os.walk(base)
                for name in dirs + files)
seen = {k: v for k, v in os.environ.items() if k.startswith(("SM_", "TRAINYARD_", "PYTHON"))
        or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DATABASE_URL", "TMPDIR")}
out_dir = os.environ["SM_OUTPUT_DATA_DIR"]
with open(os.path.join(out_dir, "env.json"), "w") as out:
    json.dump({"env": seen, "layout": layout, "cwd": os.getcwd(), "argv": os.sys.argv[1:]}, out, indent=1)
