"""Rank 1 dies the way gloo's teardown sometimes does ("terminate called without an active
exception", SIGABRT) while rank 0 is still finishing: it writes the model seconds later."""

import os
import sys
import time

if os.environ["RANK"] == "0":
    time.sleep(4.0)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w") as out:
        out.write("trained")
    print("rank 0 saved the model", flush=True)
    sys.exit(0)
sys.stderr.write("terminate called without an active exception\n")
sys.stderr.flush()
os.abort()
