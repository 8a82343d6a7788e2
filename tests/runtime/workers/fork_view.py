"""What a rank sees of how its host started it (tests/runtime/host/test_fork_server.py): its
environment, random draws, process name, SIGTERM mask, its parent, and whether torch's
distributed modules were imported before this script's first line. With --fail-rank R, rank R
raises before the barrier; with --sleep, every rank then waits for a stop and takes a second
to end."""

from __future__ import annotations

import sys

PRELOADED = "torch.distributed.fsdp" in sys.modules  # before this script imports it (below)

import argparse  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy  # noqa: E402
import torch.distributed as dist  # noqa: E402
from report import report  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402, F401 - what the server preloads


def blocked(signal_number: int) -> bool:
    status = Path("/proc/self/status").read_text()
    mask = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(mask.split()[1], 16) & (1 << (signal_number - 1)))


def parent() -> dict[str, object]:
    ppid = os.getppid()
    stat = Path(f"/proc/{ppid}/stat").read_text()
    return {"pid": ppid, "name": Path(f"/proc/{ppid}/comm").read_text().strip(),
            "ppid": int(stat[stat.rindex(")") + 2:].split()[1])}


parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--sleep", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
if dist.get_rank() == args.fail_rank:
    raise RuntimeError(f"rank {args.fail_rank} fails on purpose")
report({"env": dict(os.environ), "random": [random.random(), float(numpy.random.random())],
        "preloaded": PRELOADED, "pid": os.getpid(), "parent": parent(),
        "name": Path("/proc/self/comm").read_text().strip(),
        "process": multiprocessing.current_process().name,
        "sigterm_blocked": blocked(signal.SIGTERM)})
dist.barrier()
if args.sleep:  # until stopped, then a second's work (a checkpoint) in the stop's grace period
    import meshtrain_runtime

    print(f"running rank {dist.get_rank()}", flush=True)
    while not meshtrain_runtime.stop_requested():
        time.sleep(0.05)
    time.sleep(1.0)
    report({"stopped": True})
