"""The smallest job that completes: proves a worker is healthy after a bad job."""

import os

with open(os.path.join(os.environ["SM_MODEL_DIR"], "ok.txt"), "w") as out:
    out.write("ok")
print("done", flush=True)
