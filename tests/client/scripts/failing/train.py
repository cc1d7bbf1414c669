"""Fails on purpose after one line of output, with its reason in $SM_OUTPUT_DIR/failure."""

import os
import sys

print("checking the hyperparameters", flush=True)
with open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w") as out:
    out.write("epochs must be positive, got -1")
sys.exit(2)
