"""Watches for a stop (so SIGTERM no longer ends it) and then ignores it: only SIGKILL, after
the grace period, ends this script."""

import time

import torch.distributed as dist

import meshtrain_runtime as mr

dist.init_process_group("gloo")
mr.stop_requested()
print("watching for a stop, and ignoring it", flush=True)
while True:
    time.sleep(0.5)
    if mr.stop_requested():
        print("stop requested; not stopping", flush=True)
