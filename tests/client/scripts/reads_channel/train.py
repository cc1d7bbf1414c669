"""Prints the files of its `train` channel and their first line."""

import os

channel = os.environ["SM_CHANNEL_TRAIN"]
for folder, _, names in sorted(os.walk(channel)):
    for name in sorted(names):
        path = os.path.join(folder, name)
        with open(path) as source:
            print(f"channel file {os.path.relpath(path, channel)}: {source.readline().strip()}", flush=True)
