"""Runs until stopped; prints once it is running so tests know when to stop it."""

import time

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"running rank {dist.get_rank()}", flush=True)
time.sleep(600)
