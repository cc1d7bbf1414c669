"""Three nodes: rank 1 dies the way gloo's teardown sometimes does ("terminate called without
an active exception", SIGABRT); rank 2 ends cleanly, so its torchrun waits in the exit barrier
for rank 1's, which never comes; rank 0 writes the model a few seconds later."""

import os
import sys
import time

rank = os.environ["RANK"]
if rank == "0":
    time.sleep(4.0)
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.txt"), "w") as out:
        out.write("trained")
    print("rank 0 saved the model", flush=True)
    sys.exit(0)
if rank == "2":
    time.sleep(2.0)  # a real rank lives past the agent's poll (importing torch alone takes seconds)
    print("rank 2 done", flush=True)
    sys.exit(0)
sys.stderr.write("terminate called without an active exception\n")
sys.stderr.flush()
os.abort()
