"""Says which process started it: the launcher's parent is the node worker (a cold start
through torch.distributed.run) or the warm pool's fork server."""

import os
import sys

import psutil

already = "torch" in sys.modules
launcher = psutil.Process(os.getppid())
starter = psutil.Process(launcher.ppid())
print(f"started-by pid={starter.pid} cmd={' '.join(starter.cmdline())} torch-preloaded={already}", flush=True)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "who.txt"), "w") as out:
    out.write(str(starter.pid))
