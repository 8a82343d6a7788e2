"""Every rank waits in a collective; rank 3 (on algo-2) dies: `--mode raise` or `--mode kill`.

The survivors' barrier fails a moment later with gloo's "Connection closed by peer": the
secondary errors that must never be blamed instead of rank 3.
"""

import os
import signal
import sys
import time

import torch.distributed as dist

mode = sys.argv[sys.argv.index("--mode") + 1]
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
if rank == 3:
    assert os.environ["SM_CURRENT_HOST"] == "algo-2"
    time.sleep(0.3)  # the others are inside the next barrier by now
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("rank 3 lost its optimizer state (on purpose)")
dist.barrier()
time.sleep(120)
