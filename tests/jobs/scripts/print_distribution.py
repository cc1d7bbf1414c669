"""Prints the distribution this process was launched with, raw and as trainyard reads it."""

import json
import os

from trainyard.env import TrainingEnvironment, read_distribution

print("TRAINYARD_DISTRIBUTION=" + os.environ["TRAINYARD_DISTRIBUTION"], flush=True)
print("read_distribution=" + json.dumps(read_distribution()), flush=True)
assert TrainingEnvironment.from_env().distribution == read_distribution()
if os.environ.get("RANK", "0") == "0":
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "ok.txt"), "w") as out:
        out.write("ok")
