"""An SMP v2 script (`import torch.sagemaker as tsm`) on 2 local hosts, then resumed.

    python examples/smp_v2/launch.py [--checkpoint-dir DIR] [--tensor-parallel-degree 1]

Job 1: 2 hosts x 2 processes, tensor_parallel_degree=2 x hybrid_shard_degree=2 (the
distribution dict of AWS's SMP v2 notebooks), trains steps 0-5 and writes SMP's sharded
checkpoint after step 3. Job 2: the same layout resumes from that checkpoint and trains steps
3-5 again: its losses are job 1's (the data of a step is fixed by the step).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from meshtrain import Estimator

HERE = Path(__file__).parent
SAVE_AT, STEPS = 3, 6


def run(tp: int, checkpoint_dir: Path, resume_from: int = -1) -> Estimator:
    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(HERE),
        instance_type="local",  # "ml.p4d.24xlarge" on SageMaker
        instance_count=2,
        base_job_name="smp-v2" if resume_from < 0 else "smp-v2-resume",
        hyperparameters={"steps": STEPS, "save-at": SAVE_AT, "resume-from": resume_from},
        checkpoint_local_path=str(checkpoint_dir),  # SM_CHECKPOINT_DIR in the job
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "tensor_parallel_degree": tp,
                "hybrid_shard_degree": 2,
            }}},
        },
    )
    estimator.fit()
    print(f"Model artifacts: {estimator.model_data}")
    return estimator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="shared checkpoint directory (default: a new temporary one)")
    parser.add_argument("--tensor-parallel-degree", type=int, default=2, choices=[1, 2])
    args = parser.parse_args()
    # without --checkpoint-dir: a temporary folder, removed at the end (even after a failure)
    with tempfile.TemporaryDirectory(prefix="smp-v2-ckpt-") as scratch:
        checkpoints = (args.checkpoint_dir or Path(scratch)).resolve()
        print(f"Checkpoints in {checkpoints}"
              + ("" if args.checkpoint_dir else " (removed at the end; --checkpoint-dir keeps "
                                                "them)"))
        run(args.tensor_parallel_degree, checkpoints)
        run(args.tensor_parallel_degree, checkpoints, resume_from=SAVE_AT)
        print("Checkpoint folders: " + ", ".join(
            sorted(str(p.relative_to(checkpoints)) for p in checkpoints.glob("*/*"))))


if __name__ == "__main__":
    main()
