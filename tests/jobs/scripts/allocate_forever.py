"""Allocates (and touches) 10 MB every 50 ms until something kills it."""

import time

blocks = []
while True:
    blocks.append(b"\x01" * (10 * 1024 * 1024))
    print(f"holding {len(blocks) * 10} MB", flush=True)
    time.sleep(0.05)
