"""Every rank writes a file; rank 3 (on algo-2) then raises while the others wait."""

import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
with open(os.path.join(os.environ["SM_MODEL_DIR"], f"before-failure-{rank}.txt"), "w") as f:
    f.write("kept")
if os.environ["SM_CURRENT_HOST"] == "algo-2" and rank == 3:
    time.sleep(0.5)
    raise ValueError("loss became NaN at step 7 (on purpose)")
time.sleep(300)
