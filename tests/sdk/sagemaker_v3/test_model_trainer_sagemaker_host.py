"""A ModelTrainer job on a SageMaker host: what SageMaker does with the request, done by hand.

The ModelTrainer submits to moto; the host's /opt/ml is laid out from the CreateTrainingJob
request as SageMaker lays it out (config files, every channel downloaded: the data, the `code`
channel, meshtrain's `sm_drivers` channel), and the request's container start runs: its
`sm_train.sh` hands the host to the runtime shipped in the channel, which trains with the SMP
parameters the request carries (`mp_parameters`) and passes the hyperparameters as SDK v3's
drivers do (`--key <JSON>`, in the given order).
"""

from __future__ import annotations

import json
import os
import subprocess

import boto3
import pytest
from v3_cells import DATA_BUCKET, REGION, ROLE
from test_sagemaker_container_entry import free_port, lay_out_host  # conftest's path

from meshtrain.sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train.configs import Compute, InputData, SourceCode
from meshtrain.sagemaker.train.distributed import SMP, Torchrun

SCRIPT = """\
import argparse, json, os, sys
import torch
import meshtrain_runtime

parser = argparse.ArgumentParser()
parser.add_argument("--mp_parameters", type=json.loads)
parser.add_argument("--layers", type=json.loads)
parser.add_argument("--name")
args = parser.parse_args()
state = meshtrain_runtime.init()
torch.manual_seed(0)
model = meshtrain_runtime.transform(torch.nn.Sequential(torch.nn.Linear(4, 8),
                                                        torch.nn.Linear(8, 1)))
loss = model(torch.ones(2, 4)).pow(2).mean()
loss.backward()
report = {"rank": state.rank, "world_size": state.world_size, "argv": sys.argv[1:],
          "hybrid_shard_degree": state.hybrid_shard_degree, "args": vars(args),
          "runtime": meshtrain_runtime.__file__, "cwd": os.getcwd(),
          "entry": os.environ["SM_ENTRY_SCRIPT"], "source": os.environ["SM_SOURCE_DIR"],
          "distributed": json.loads(os.environ["SM_DISTRIBUTED_CONFIG"]),
          "data": open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "part-0")).read()}
open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{state.rank}.json"), "w").write(
    json.dumps(report))
"""


@pytest.mark.multiprocess
def test_sagemaker_host_runs_meshtrains_drivers_with_the_smp_parameters(aws, tmp_path):
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=DATA_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=DATA_BUCKET, Key="train/part-0", Body=b"7 8 9")
    trainer = ModelTrainer(
        training_image="123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:1.0",
        role=ROLE, source_code=SourceCode(source_dir=str(source), entry_script="train.py"),
        compute=Compute(instance_type="ml.g5.12xlarge"),
        distributed=Torchrun(process_count_per_node=2, smp=SMP(hybrid_shard_degree=2)),
        hyperparameters={"name": "run 1", "layers": [2, 4]},
        input_data_config=[InputData(channel_name="train", data_source=f"s3://{DATA_BUCKET}/"
                                                                       "train")])
    trainer.train(wait=False)
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    request = create.json()

    base = tmp_path / "opt" / "ml"
    lay_out_host(request, base)
    start = request["AlgorithmSpecification"]
    assert start["ContainerEntrypoint"] == ["/bin/bash"]
    drivers = base / "input" / "data" / "sm_drivers"
    assert f"{drivers.relative_to(tmp_path)}/sm_train.sh".removeprefix("opt") in (
        start["ContainerArguments"][1])
    env = {**os.environ, **request.get("Environment", {}), "SAGEMAKER_BASE_DIR": str(base),
           "TRAINING_JOB_NAME": request["TrainingJobName"], "OMP_NUM_THREADS": "1",
           "MESHTRAIN_MASTER_ADDR": "127.0.0.1", "MESHTRAIN_MASTER_PORT": str(free_port()),
           "TMPDIR": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["/bin/bash", str(drivers / "sm_train.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (base / "output" / "success").exists()

    reports = [json.loads(p.read_text()) for p in sorted((base / "model").glob("rank-*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["world_size"] == 2 and report["hybrid_shard_degree"] == 2
        assert report["argv"] == ["--name", "run 1", "--layers", "[2, 4]",
                                  "--mp_parameters", '{"hybrid_shard_degree": 2}']
        assert report["args"]["mp_parameters"] == {"hybrid_shard_degree": 2}
        assert report["runtime"].startswith(f"{tmp_path}/meshtrain-runtime.")  # shipped copy
        assert report["cwd"] == report["source"] == str(base / "input" / "data" / "code")
        assert report["entry"] == "train.py" and report["data"] == "7 8 9"
        assert report["distributed"]["smp"]["hybrid_shard_degree"] == 2
