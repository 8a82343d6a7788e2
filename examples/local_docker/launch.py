"""The quickstart job in Docker containers: each of the 2 hosts is a container on a per-job
network, running the image the job would ship with.

    python examples/local_docker/launch.py                  # meshtrain's CPU image, built once
    python examples/local_docker/launch.py --image IMAGE    # any image with python3 and torch
    python examples/local_docker/launch.py --compare        # also as local processes: same loss

Needs a running Docker engine (`docker` on PATH). Without --image, meshtrain builds its own CPU
image on first use (`meshtrain image build`, a few minutes once, then cached by tag).
"""

import argparse
import io
import json
import tarfile
from pathlib import Path
from urllib.parse import urlparse

from meshtrain import Estimator

QUICKSTART = Path(__file__).resolve().parents[1] / "quickstart"
CORPUS = QUICKSTART.parent / "data" / "corpus"  # the quickstart's `train` channel


def run(instance_type: str, image: str | None) -> list[float]:
    """The quickstart's 2-host x 2-process hybrid-sharded job on `instance_type`; its losses."""
    estimator = Estimator(
        entry_point="train.py",
        source_dir=str(QUICKSTART),
        base_job_name=f"quickstart-{instance_type.replace('_', '-')}",
        instance_type=instance_type,
        instance_count=2,
        image_uri=image,
        hyperparameters={"steps": 20, "lr": 3e-3},
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": 2,
            }}},
        },
    )
    estimator.fit(inputs={"train": str(CORPUS)})
    print(f"Model artifacts: {estimator.model_data}")
    output = Path(urlparse(estimator.model_data).path).with_name("output.tar.gz")
    with tarfile.open(output) as tar:
        return json.load(io.BytesIO(tar.extractfile("losses.json").read()))["train:loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", help="an image with python3 and torch (default: meshtrain's)")
    parser.add_argument("--compare", action="store_true",
                        help="run the same job as local processes and compare the losses")
    args = parser.parse_args()
    in_docker = run("local_docker", args.image)
    print(f"local_docker: final loss {in_docker[-1]:.6f}")
    if args.compare:
        as_processes = run("local", None)
        gap = max(abs(a - b) for a, b in zip(in_docker, as_processes, strict=True))
        print(f"local processes: final loss {as_processes[-1]:.6f}; "
              f"largest difference per step {gap:.2e}")


if __name__ == "__main__":
    main()
