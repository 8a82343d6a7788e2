"""Keeps the CPU busy beside another job: each rank of a 2-process job multiplies matrices until
``$BUSY_STOP`` exists or 600 s have passed (the ranks agree on when, over an all-reduce)."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"busy rank {dist.get_rank()}", flush=True)
stop, deadline = Path(os.environ["BUSY_STOP"]), time.monotonic() + 600
a = torch.randn(256, 256)
while True:
    for _ in range(20):
        a = torch.tanh(a @ a.T / 256)
    done = torch.tensor([int(stop.exists() or time.monotonic() > deadline)])
    dist.all_reduce(done, op=dist.ReduceOp.MAX)
    if done.item():
        break
