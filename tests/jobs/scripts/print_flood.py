"""Prints ~100 MB (100,000 lines of 1 KB), then completes."""

import os
import sys

line = ("x" * 1023 + "\n").encode()
out = sys.stdout.buffer
for _ in range(100_000):
    out.write(line)
print("flood over loss=0.5", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "ok.txt"), "w") as model:
    model.write("survived")
