"""What a rank sees of its launch (tests/runtime/test_fork_ranks.py): the environment, the
process group, whether torch thinks torchelastic launched it, and a draw of Python's and
numpy's random numbers. With --fail-rank R, rank R raises before the barrier the others wait
in."""

from __future__ import annotations

import argparse
import os
import random

import numpy
import torch.distributed as dist
from report import report

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", type=int, default=-1)
args = parser.parse_args()
dist.init_process_group("gloo")
if dist.get_rank() == args.fail_rank:
    raise RuntimeError(f"rank {args.fail_rank} fails on purpose")
report({"world_size": dist.get_world_size(), "env": dict(os.environ),
        "random": [random.random(), float(numpy.random.random())],
        "elastic": dist.is_torchelastic_launched()})
dist.barrier()
