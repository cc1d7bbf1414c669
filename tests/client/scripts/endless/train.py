"""Trains until it is stopped, logging a loss each step."""

import time

from trainyard import log_metric

step = 0
while True:
    step += 1
    log_metric("loss", 1.0 / step, step)
    print(f"step {step}", flush=True)
    time.sleep(0.2)
