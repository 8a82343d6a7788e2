"""Rank 2 (the first rank of the second host) raises; the others wait to be ended."""

import os
import time

if int(os.environ["RANK"]) == 2:
    raise ValueError("bad shard 7 on purpose")
time.sleep(300)
