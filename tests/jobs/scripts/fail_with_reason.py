"""Fails on purpose: `--mode file` writes its reason to $SM_OUTPUT_DIR/failure (SageMaker's
convention), `--mode raise` just raises."""

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="file")
args, _ = parser.parse_known_args()
print("starting, about to fail", flush=True)
if args.mode == "file":
    with open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w") as out:
        out.write("epochs must be positive, got -1")
    sys.exit(2)
raise ValueError("the learning rate 7.5 is far too high")
