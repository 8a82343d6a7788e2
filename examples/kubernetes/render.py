"""Render examples/llama_tp_hsdp's job as a Kubeflow PyTorchJob (or TrainJob) for kubectl.

    python examples/kubernetes/render.py \
        --image <account>.dkr.ecr.<region>.amazonaws.com/meshtrain:0.1 --out job.yaml
    kubectl apply -f job.yaml

No cluster, no Kubernetes client and no torch are needed to render: the Estimator is the same one
examples/llama_tp_hsdp runs locally, pointed at 2 x ml.p4d.24xlarge; meshtrain writes a ConfigMap
(the job's /opt/ml contract and its code) and the PyTorchJob (or, with --kind TrainJob, a Kubeflow
Trainer v2 TrainJob) that runs meshtrain's bootstrap in every pod.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshtrain import Estimator, kubernetes

TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "llama_tp_hsdp"


def build_estimator(image: str) -> Estimator:
    """The local example's layout on 2 instances of 8 GPUs: each layer split over 2 GPUs, the 4
    TP pairs of an instance sharding the rest, the two instances replicas (SMP's hybrid)."""
    return Estimator(
        entry_point="train.py",
        source_dir=str(TRAIN_SCRIPT),
        instance_type="ml.p4d.24xlarge",
        instance_count=2,
        image_uri=image,
        hyperparameters={"steps": 1000, "lr": 3e-4, "global-batch": 16},
        max_run=24 * 3600,
        distribution={
            "torch_distributed": {"enabled": True},  # one process per GPU: 8 per pod
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "tensor_parallel_degree": 2,  # TP pairs inside each instance (NVLink)
                "hybrid_shard_degree": 4,  # shard within an instance, replicate across
            }}},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", required=True, help="the training image (meshtrain inside)")
    parser.add_argument("--out", default="job.yaml", help="where to write the manifest")
    parser.add_argument("--namespace", default="training")
    parser.add_argument("--kind", default="PyTorchJob", choices=["PyTorchJob", "TrainJob"])
    parser.add_argument("--data-claim", default="datasets",
                        help="a PersistentVolumeClaim holding the training data")
    args = parser.parse_args()
    objects = kubernetes.render_all(
        build_estimator(args.image), job_name="llama-tp-hsdp", namespace=args.namespace,
        kind=args.kind, inputs={"train": f"pvc://{args.data_claim}/llama/train"})
    Path(args.out).write_text(kubernetes.to_yaml(objects))
    job = objects[1]
    print(f"wrote {args.out}: ConfigMap {objects[0]['metadata']['name']} + {job['kind']} "
          f"{job['metadata']['name']} in namespace {args.namespace}")
    print(f"next: kubectl apply -f {args.out}")


if __name__ == "__main__":
    main()
