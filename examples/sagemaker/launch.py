"""Launch the example on Amazon SageMaker (or, with --instance-type local, on this machine).

    export MESHTRAIN_IMAGE_URI=<account>.dkr.ecr.<region>.amazonaws.com/meshtrain:latest
    python examples/sagemaker/launch.py --role arn:aws:iam::<account>:role/SageMakerRole

AWS access comes from boto3's usual chain (AWS_PROFILE, SSO, environment, instance role) and
region. Everything can also come from the environment: SAGEMAKER_ROLE, MESHTRAIN_EXAMPLE_BUCKET,
MESHTRAIN_IMAGE_URI, and AWS_ENDPOINT_URL (boto3's own variable; unset for real AWS, the tests
point it at a local moto server).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from meshtrain import Estimator
from meshtrain.backends.sagemaker.metrics import metric_definitions
from meshtrain.plan import gpus_per_instance


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instance-type", default="ml.g5.12xlarge",
                        help="an ml.* type (4 A10G GPUs by default), or 'local'")
    parser.add_argument("--instance-count", type=int, default=2)
    parser.add_argument("--role", default=os.environ.get("SAGEMAKER_ROLE"),
                        help="IAM role SageMaker assumes (env SAGEMAKER_ROLE)")
    parser.add_argument("--bucket", default=os.environ.get("MESHTRAIN_EXAMPLE_BUCKET"),
                        help="S3 bucket for code and model (default: sagemaker-<region>-<account>)")
    parser.add_argument("--image-uri", default=os.environ.get("MESHTRAIN_IMAGE_URI"))
    parser.add_argument("--endpoint-url", default=None,
                        help="send every AWS request here (a moto server in the tests)")
    parser.add_argument("--job-name", default=None)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--no-wait", action="store_true", help="return once the job is created")
    return parser.parse_args()


def build_estimator(args: argparse.Namespace) -> Estimator:
    local = args.instance_type == "local"
    # One rank per GPU on SageMaker; two CPU processes per host locally.
    processes = 2 if local else gpus_per_instance(args.instance_type)
    torch_distributed = {"enabled": True}
    if local:
        torch_distributed["processes_per_host"] = processes
    cloud = {} if local else {
        "role": args.role, "image_uri": args.image_uri,
        "output_path": f"s3://{args.bucket}/meshtrain-examples/" if args.bucket else None,
        "metric_definitions": metric_definitions("train:loss"),
    }
    return Estimator(
        entry_point="train.py",
        source_dir=str(Path(__file__).parent),
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        base_job_name="meshtrain-example",
        hyperparameters={"steps": args.steps},
        distribution={
            "torch_distributed": torch_distributed,
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": processes,  # shard within a host, replicate across hosts
            }}},
        },
        **cloud,
    )


def main() -> None:
    args = parse_args()
    if args.endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint_url  # boto3 reads it for every client
    estimator = build_estimator(args)
    job = estimator.fit(job_name=args.job_name, wait=not args.no_wait)
    print(f"Training job: {job.name} ({job.status})")
    print(f"Model artifacts: {estimator.model_data}")


if __name__ == "__main__":
    main()
