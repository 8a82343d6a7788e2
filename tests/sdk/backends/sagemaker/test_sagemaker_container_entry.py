"""The container side: what SageMaker does with meshtrain's request, done by hand, then
`containers/train` (the image's `train`) runs the job from it.

SageMaker writes the request's HyperParameters to /opt/ml/input/config/hyperparameters.json,
the hosts to resourceconfig.json, the channels to inputdataconfig.json, downloads File-mode
channels to /opt/ml/input/data/<channel>, sets TRAINING_JOB_NAME and the request's Environment,
and runs `train`. The code comes from S3 (moto, over HTTP) as the request says.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import boto3
import pytest
from sagemaker_moto import REGION, ROLE

from meshtrain import Estimator
from meshtrain.backends.sagemaker.metrics import metric_definitions
from meshtrain.contract.metrics import STANDARD_METRICS

TRAIN = Path(__file__).resolve().parents[4] / "containers" / "train"
SCRIPT = """\
import argparse, json, os
import meshtrain_runtime
from meshtrain_runtime.metrics import log_metric

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
args, unknown = parser.parse_known_args()  # the toolkit also passes --mp_parameters k=v,...
state = meshtrain_runtime.init()
shard = open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "shard-0.txt")).read()
log_metric("train:loss", 0.5, step=args.epochs)
report = {"rank": state.rank, "world_size": state.world_size, "epochs": args.epochs,
          "hybrid_shard_degree": state.hybrid_shard_degree, "shard": shard,
          "mp_parameters": json.loads(os.environ["SM_HP_MP_PARAMETERS"]),
          "job": os.environ["TRAINING_JOB_NAME"], "nccl_debug": os.environ["NCCL_DEBUG"],
          "unknown_args": unknown}
path = os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{state.rank}.json")
open(path, "w").write(json.dumps(report))
"""
DISTRIBUTION = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
                "smdistributed": {"modelparallel": {"enabled": True,
                                                    "parameters": {"hybrid_shard_degree": 2}}}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lay_out_host(request: dict, base: Path, host: str = "algo-1") -> None:
    """/opt/ml as SageMaker prepares it on `host` from the CreateTrainingJob request."""
    config = base / "input" / "config"
    for directory in (config, base / "model", base / "output" / "data"):  # the platform's dirs
        directory.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(request["HyperParameters"]))
    instance = request["ResourceConfig"]["InstanceType"]
    (config / "resourceconfig.json").write_text(json.dumps({
        "current_host": host, "hosts": [host], "current_group_name": "homogeneousCluster",
        "current_instance_type": instance, "network_interface_name": "eth0",
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "instance_type": instance, "hosts": [host]}]}))
    channels = {}
    s3 = boto3.client("s3")
    for channel in request["InputDataConfig"]:
        name, uri = channel["ChannelName"], channel["DataSource"]["S3DataSource"]["S3Uri"]
        channels[name] = {"TrainingInputMode": request["AlgorithmSpecification"]
                          ["TrainingInputMode"], "S3DistributionType": "FullyReplicated",
                          "RecordWrapperType": "None"}
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:
            target = base / "input" / "data" / name / item["Key"][len(prefix):].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target))
    (config / "inputdataconfig.json").write_text(json.dumps(channels))


@pytest.mark.multiprocess
def test_train_entry_runs_the_job_meshtrain_submitted(aws, tmp_path):
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket="data-bucket", Key="train/shard-0.txt", Body=b"1 2 3")
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE,
                          image_uri="meshtrain:0.1.0",  # containers/Dockerfile's image
                          instance_type="ml.g5.12xlarge", distribution=DISTRIBUTION,
                          hyperparameters={"epochs": 3}, environment={"NCCL_DEBUG": "WARN"},
                          metric_definitions=metric_definitions("train:loss"))
    estimator.fit({"train": "s3://data-bucket/train"}, job_name="container-run", wait=False)
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    request = create.json()

    base = tmp_path / "opt" / "ml"
    lay_out_host(request, base)
    env = {**os.environ, **request.get("Environment", {}), "SAGEMAKER_BASE_DIR": str(base),
           "TRAINING_JOB_NAME": request["TrainingJobName"], "OMP_NUM_THREADS": "1",
           "MESHTRAIN_MASTER_ADDR": "127.0.0.1", "MESHTRAIN_MASTER_PORT": str(free_port()),
           "MESHTRAIN_NUM_GPUS": "0"}
    done = subprocess.run([str(TRAIN)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (base / "output" / "success").exists()

    reports = sorted((base / "model").glob("rank-*.json"))
    seen = [json.loads(path.read_text()) for path in reports]
    assert [r["rank"] for r in seen] == [0, 1]
    for report in seen:
        assert report["world_size"] == 2 and report["hybrid_shard_degree"] == 2
        assert report["mp_parameters"] == {"hybrid_shard_degree": 2}
        assert report["epochs"] == 3 and report["shard"] == "1 2 3"
        assert report["job"] == "container-run" and report["nccl_debug"] == "WARN"
        assert report["unknown_args"] == ["--mp_parameters", "hybrid_shard_degree=2"]
    # the metric line the rank printed is what the MetricDefinitions sent capture
    definition, *standard = request["AlgorithmSpecification"]["MetricDefinitions"]
    assert [d["Name"] for d in standard] == [n for n in STANDARD_METRICS if n != definition["Name"]]
    assert re.findall(definition["Regex"], done.stdout) == ["0.5"]
