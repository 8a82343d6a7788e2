"""A rank that says hello and, on rank 0, logs three steps of standard metrics."""

import os

from meshtrain_runtime import metrics

rank = int(os.environ["RANK"])
print(f"hello from rank {rank} on {os.environ['SM_CURRENT_HOST']}", flush=True)
for step in range(3):
    metrics.log(step=step, loss=3.0 - step, tokens=1024, seconds=0.5)
