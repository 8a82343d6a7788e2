"""torchrun worker: tp 2 x hybrid 2 (8 ranks: tp 2 x 2 replicas x shard 2) saves; 2 ranks resume.

Usage (through tests/runtime/conftest.py's run_torchrun): ``ckpt_reshard8.py save ROOT`` on 8
ranks trains two steps and saves ``ROOT/tp2_hybrid2/step_00000002``; ``ckpt_reshard8.py load
ROOT`` on 2 ranks loads it into full sharding and trains two more steps. Rank 0 reports the
losses and the layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ckpt_support as support
import torch.distributed as dist
from report import report_cases

import meshtrain_runtime as mr

TP2_HYBRID2 = {"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}


def _save(root: Path) -> dict:
    record = support.train_and_save(TP2_HYBRID2, root / "tp2_hybrid2")
    return {**record, "dp_size": mr.state.dp_size, "replicate": mr.state.replicate_degree,
            "shard": mr.state.hybrid_shard_degree, "tp_size": mr.state.tp_size}


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    if mode == "save":
        report_cases([("save_tp2_hybrid2", lambda: _save(root))])
    else:
        report_cases([("tp2_hybrid2_to_full_shard_2", lambda: support.load_and_continue(
            support.FULL_SHARD, root / "tp2_hybrid2"))])
    mr.reset()


if __name__ == "__main__":
    main()
