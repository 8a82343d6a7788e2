"""torchrun worker (4 ranks): train hybrid 2x2 for two steps and save a sharded checkpoint.

Usage (through tests/runtime/conftest.py's run_torchrun): ``ckpt_save.py ROOT``. Writes
``ROOT/hybrid/step_00000002``; rank 0 reports the losses before the save and the directory.
The 2-rank worker ckpt_load.py and the in-process test load it on other layouts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ckpt_support as support
import torch.distributed as dist
from report import report

import meshtrain_runtime as mr


def main() -> None:
    root = Path(sys.argv[1])
    dist.init_process_group("gloo")
    record = support.train_and_save(support.HYBRID_2X2, root / "hybrid")
    record.update(case="save_hybrid_2x2", dp_size=mr.state.dp_size,
                  replicate=mr.state.replicate_degree, shard=mr.state.hybrid_shard_degree)
    if dist.get_rank() == 0:
        report(record)
    mr.reset()


if __name__ == "__main__":
    main()
