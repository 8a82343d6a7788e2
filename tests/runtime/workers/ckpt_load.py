"""torchrun worker (2 ranks): resume checkpoints on a different layout; save and export under TP.

Usage (through tests/runtime/conftest.py's run_torchrun): ``ckpt_load.py ROOT``, after
ckpt_save.py wrote ``ROOT/hybrid``. Rank 0 reports one record per case:

- ``hybrid_2x2_to_full_shard_2``: load the 4-rank hybrid checkpoint (its root: the latest
  completed step) into full sharding on 2 ranks, train two more steps;
- ``save_tp2``: tp=2 (no FSDP) trains two steps, saves ``ROOT/tp`` and exports the full state
  dict to ``ROOT/export_tp`` (HF layout, safetensors);
- ``tp2_to_full_shard_2``: load that checkpoint into full sharding on 2 ranks, two more steps;
- ``hybrid_2x2_async_to_full_shard_2``, ``tp2_shard2_to_full_shard_2``: the same from the
  asynchronously saved hybrid checkpoint and from tp 2 x shard 2;
- ``ep2_to_ep1``: the Mixtral saved with ep 2 resumed without expert parallelism (full shard);
- ``save_ep1`` / ``ep1_to_ep2``: and back: ep 1 on 2 ranks saves, ep 2 on 2 ranks resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ckpt_support as support
import torch.distributed as dist
from report import report_cases

import meshtrain_runtime as mr
from meshtrain_runtime.checkpoint import export_full_state_dict, save_checkpoint


def save_tp2(root: Path) -> dict[str, Any]:
    model, optimizer = support.start(support.TP2)
    losses = support.train(model, optimizer, range(support.STEPS_BEFORE))
    saved = save_checkpoint(root / "tp", model, optimizer, step=support.STEPS_BEFORE,
                            extra={"layout": support.TP2, "next_step": support.STEPS_BEFORE})
    exported = export_full_state_dict(model, root / "export_tp")
    return {"losses": losses, "saved": str(saved), "tp_size": mr.state.tp_size,
            "exported": str(exported) if exported is not None else None}


def main() -> None:
    root = Path(sys.argv[1])
    dist.init_process_group("gloo")
    cases = [
        ("hybrid_2x2_to_full_shard_2",
         lambda: support.load_and_continue(support.FULL_SHARD, root / "hybrid")),
        ("save_tp2", lambda: save_tp2(root)),
        ("tp2_to_full_shard_2",
         lambda: support.load_and_continue(support.FULL_SHARD, root / "tp")),
        ("hybrid_2x2_async_to_full_shard_2",
         lambda: support.load_and_continue(support.FULL_SHARD, root / "hybrid_async")),
        ("tp2_shard2_to_full_shard_2",
         lambda: support.load_and_continue(support.FULL_SHARD, root / "tp2_shard2")),
        ("ep2_to_ep1",
         lambda: support.load_and_continue(support.FULL_SHARD, root / "ep2", kind="mixtral")),
        ("save_ep1",
         lambda: support.train_and_save(support.FULL_SHARD, root / "ep1", kind="mixtral")),
        ("ep1_to_ep2",
         lambda: support.load_and_continue(support.EP2, root / "ep1", kind="mixtral")),
    ]
    report_cases(cases)
    mr.reset()


if __name__ == "__main__":
    main()
