"""Runs until the file named by --release exists (at most 120 s), then completes."""

import argparse
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--release", required=True)
args = parser.parse_args()
deadline = time.monotonic() + 120
while not os.path.exists(args.release) and time.monotonic() < deadline:
    time.sleep(0.1)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "released.txt"), "w") as out:
    out.write(str(os.path.exists(args.release)))
print("released", flush=True)
