"""gpu-check section "docker": the quickstart's training script as a local_gpu job.

One container on this machine's Docker engine with every GPU passed through (``--gpus all``),
one process, 5 steps, the repository's corpus as its `train` channel. The image:
MESHTRAIN_GPU_IMAGE (any image with python3, a CUDA build of torch and pydantic; meshtrain
mounts its own packages into it), else meshtrain's default image for the target. Exit 0 when
the job completed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    from meshtrain import Estimator

    estimator = Estimator(
        entry_point="train.py", source_dir=str(ROOT / "examples" / "quickstart"),
        instance_type="local_gpu", instance_count=1, image_uri=os.environ.get(
            "MESHTRAIN_GPU_IMAGE"), hyperparameters={"steps": 5, "lr": 3e-3},
        distribution={"torch_distributed": {"enabled": True, "processes_per_host": 1}},
    )
    estimator.fit(inputs={"train": str(ROOT / "examples" / "data" / "corpus")})
    print(f"local_gpu job completed: {estimator.model_data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
