"""Writes what reached it — sys.argv[1:], SM_HPS and the SM_HP_* variables — to
$SM_MODEL_DIR/argv.json, and how it was started: torch already imported (warm) and the pid
of its launcher's parent (the node worker, or the warm pool's fork server)."""

import json
import os
import sys

import psutil

torch_preloaded = "torch" in sys.modules
seen = {
    "argv": sys.argv[1:],
    "sm_hps": json.loads(os.environ["SM_HPS"]),
    "sm_hp": {name: value for name, value in os.environ.items() if name.startswith("SM_HP_")},
    "torch_preloaded": torch_preloaded,
    "starter_pid": psutil.Process(os.getppid()).ppid(),
}
with open(os.path.join(os.environ["SM_MODEL_DIR"], "argv.json"), "w", encoding="utf-8") as out:
    json.dump(seen, out)
print(f"argv-dump: {len(sys.argv) - 1} arguments, torch-preloaded={torch_preloaded}", flush=True)
