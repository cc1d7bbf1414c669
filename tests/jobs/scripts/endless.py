"""Never finishes on its own."""

import time

step = 0
while True:
    print(f"step={step} loss={1.0 / (step + 1):.4f}", flush=True)
    step += 1
    time.sleep(0.2)
