"""Prints a tick every half second until it is stopped (SIGTERM from its host)."""

import os
import time

for tick in range(600):
    print(f"tick {tick} rank {os.environ['RANK']}", flush=True)
    time.sleep(0.5)
