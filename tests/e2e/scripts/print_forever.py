"""No torch: prints a numbered line every 0.1 s until stopped (a job that writes steadily)."""

import itertools
import time

for tick in itertools.count():
    print(f"tick {tick}", flush=True)
    time.sleep(0.1)
