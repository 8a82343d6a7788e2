"""Checkpoint on one layout, resume on another: two local jobs sharing a checkpoint directory.

    python examples/resume_other_layout/launch.py [--checkpoint-dir DIR] [--reference]

Job 1: 2 hosts x 2 processes, tensor_parallel_degree=2 (TP inside each host, the hosts are
replicas), trains steps 0-5 and saves a sharded checkpoint at step 6.
Job 2: 1 host x 2 processes, plain full sharding, finds that checkpoint, loads it into its own
layout and trains steps 6-11. With --reference, a third job trains steps 0-11 in one process
without stopping, to compare against.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from meshtrain import Estimator

HERE = Path(__file__).parent
HALF, TOTAL = 6, 12
LAYOUTS = {  # (hosts, processes per host, SMP parameters)
    "tp2-2hosts": (2, 2, {"tensor_parallel_degree": 2, "hybrid_shard_degree": 1}),
    "fsdp-1host": (1, 2, {"hybrid_shard_degree": 2}),
    "one-process": (1, 1, {}),
}


def run(layout: str, steps: int, checkpoint_dir: Path) -> Estimator:
    """One job on `layout` that trains up to global step `steps`, resuming if it can."""
    hosts, processes, parameters = LAYOUTS[layout]
    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(HERE),
        instance_type="local",
        instance_count=hosts,
        base_job_name=f"resume-{layout}",
        hyperparameters={"steps": steps, "save-every": HALF},
        checkpoint_local_path=str(checkpoint_dir),  # SM_CHECKPOINT_DIR in the job
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": processes},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}},
        },
    )
    estimator.fit()
    print(f"Model artifacts: {estimator.model_data}")
    return estimator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="shared checkpoint directory (default: a new temporary one)")
    parser.add_argument("--reference", action="store_true",
                        help="also train all steps in one process without stopping")
    args = parser.parse_args()
    # without --checkpoint-dir: a temporary folder, removed at the end (even after a failure)
    with tempfile.TemporaryDirectory(prefix="meshtrain-ckpt-") as scratch:
        checkpoints = (args.checkpoint_dir or Path(scratch) / "shared").resolve()
        print(f"Checkpoints in {checkpoints}"
              + ("" if args.checkpoint_dir else " (removed at the end; --checkpoint-dir keeps "
                                                "them)"))
        run("tp2-2hosts", HALF, checkpoints)   # saves step_00000006
        run("fsdp-1host", TOTAL, checkpoints)  # resumes from it on another layout
        print("Checkpoint steps: " + ", ".join(sorted(p.name for p in checkpoints.iterdir())))
        if args.reference:
            run("one-process", TOTAL, Path(scratch) / "reference")


if __name__ == "__main__":
    main()
