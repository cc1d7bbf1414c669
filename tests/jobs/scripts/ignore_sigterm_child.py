"""Starts a child that ignores SIGTERM (and writes its pid where the test can find it),
then trains forever: only SIGKILL after the grace period ends it."""

import argparse
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--pid-file", "--pid_file", required=True)
args, _ = parser.parse_known_args()
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)"])
with open(args.pid_file, "w") as out:
    out.write(str(child.pid))
print(f"child {child.pid} started", flush=True)
while True:
    time.sleep(0.2)
