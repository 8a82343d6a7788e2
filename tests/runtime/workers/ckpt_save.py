"""torchrun worker (4 ranks): train two steps on several layouts and save sharded checkpoints.

Usage (through tests/runtime/conftest.py's run_torchrun): ``ckpt_save.py ROOT``. Writes
``ROOT/<case>/step_00000002`` for hybrid 2x2, hybrid 2x2 saved asynchronously (while a third
step trains), tp 2 x shard 2, a Mixtral with ep 2 and tp 2 x hybrid_shard_degree 2 (the last two
also save their logits, for the export test); rank 0 reports the losses before the save and the
directory. The 2-rank worker ckpt_load.py and the in-process test load them on other
layouts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import ckpt_support as support
import torch.distributed as dist
from report import report_cases

import meshtrain_runtime as mr


def main() -> None:
    root = Path(sys.argv[1])
    dist.init_process_group("gloo")
    report_cases([
        ("save_hybrid_2x2", lambda: _with_layout(
            support.train_and_save(support.HYBRID_2X2, root / "hybrid"))),
        ("save_hybrid_2x2_async", lambda: _with_layout(
            support.train_and_save(support.HYBRID_2X2, root / "hybrid_async", async_=True))),
        ("save_tp2_shard2", lambda: _with_layout(
            support.train_and_save(support.TP2_SHARD2, root / "tp2_shard2"))),
        ("save_ep2", lambda: _with_layout(
            support.train_and_save(support.EP2, root / "ep2", kind="mixtral", logits=True))),
        ("save_tp2_hybrid2", lambda: _with_layout(
            support.train_and_save(support.TP2_HYBRID2, root / "tp2_hybrid2", logits=True))),
    ])
    mr.reset()


def _with_layout(record: dict) -> dict:
    return {**record, "dp_size": mr.state.dp_size, "replicate": mr.state.replicate_degree,
            "shard": mr.state.hybrid_shard_degree, "tp_size": mr.state.tp_size,
            "ep_size": mr.state.ep_size}


if __name__ == "__main__":
    main()
