"""A SageMaker launcher cell with instance_type="local": S3 in and out, against moto over HTTP.

The cell keeps its SageMaker-only arguments (sagemaker_session, debugger_hook_config, subnets,
security_group_ids), its S3 TrainingInput / S3 URI channels, S3 output_path and
checkpoint_s3_uri, and no processes_per_host. Two local hosts run it (real torch ranks on gloo,
meshtrain_runtime.init()/transform()); the channels arrive downloaded from moto's S3, a checkpoint
already in checkpoint_s3_uri is there to resume from, and after the job model.tar.gz,
output.tar.gz and the new checkpoints are in moto's S3.
"""

from __future__ import annotations

import io
import json
import tarfile

import boto3
import pytest
from sagemaker_moto import REGION, ROLE

from meshtrain.sagemaker import PyTorch, TrainingInput

SCRIPT = """\
import json, os, torch
import meshtrain_runtime

state = meshtrain_runtime.init()
model = meshtrain_runtime.transform(torch.nn.Sequential(torch.nn.Linear(4, 4)))
model(torch.ones(2, 4)).sum().backward()
checkpoints = os.environ["SM_CHECKPOINT_DIR"]
report = {
    "rank": state.rank, "world_size": state.world_size,
    "train": open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "part-0")).read(),
    "test": sorted(os.listdir(os.environ["SM_CHANNEL_TEST"])),
    "resumed": open(os.path.join(checkpoints, "step-10", "state.txt")).read(),
}
with open(os.path.join(checkpoints, f"step-20-rank-{state.rank}.txt"), "w") as f:
    f.write("step 20")
if state.rank == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as f:
        json.dump(report, f)
"""


def bucket(s3, name: str) -> None:
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})


@pytest.mark.multiprocess
def test_a_sagemaker_cell_runs_locally_with_s3_in_and_out(aws, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    s3 = boto3.client("s3")
    for name in ("data-bucket", "results-bucket"):
        bucket(s3, name)
    s3.put_object(Bucket="data-bucket", Key="c4/train/part-0", Body=b"1 2 3")
    for key in ("c4/val/a.json", "c4/val/nested/b.json"):
        s3.put_object(Bucket="data-bucket", Key=key, Body=b"{}")
    s3.put_object(Bucket="results-bucket", Key="ckpt/step-10/state.txt", Body=b"step 10")
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)

    estimator = PyTorch(
        entry_point="train.py", source_dir=str(source), role=ROLE, instance_type="local",
        instance_count=2, framework_version="2.5.1", py_version="py311",
        distribution={"torch_distributed": {"enabled": True}, "smdistributed": {
            "modelparallel": {"enabled": True, "parameters": {"hybrid_shard_degree": 2}}}},
        sagemaker_session=object(), debugger_hook_config=False, subnets=["subnet-0abc"],
        security_group_ids=["sg-0abc"], output_path="s3://results-bucket/out",
        checkpoint_s3_uri="s3://results-bucket/ckpt", hyperparameters={"epochs": 1})
    assert estimator.world_size == 2  # this machine has no GPU: one process per host
    job = estimator.fit({"train": TrainingInput("s3://data-bucket/c4/train"),
                         "test": "s3://data-bucket/c4/val"}, job_name="local-cell", logs=False)
    assert capsys.readouterr().err.count("local jobs ignore the SageMaker-only argument") == 1
    assert job.describe()["TrainingJobStatus"] == "Completed"
    # as on SageMaker, the model's URI is where it was uploaded
    assert estimator.model_data == "s3://results-bucket/out/local-cell/output/model.tar.gz"

    model = s3.get_object(Bucket="results-bucket", Key="out/local-cell/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(model["Body"].read())) as tar:
        report = json.load(tar.extractfile("report.json"))
    assert report == {"rank": 0, "world_size": 2, "train": "1 2 3",
                      "test": ["a.json", "nested"], "resumed": "step 10"}
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="results-bucket")["Contents"]}
    assert "out/local-cell/output/output.tar.gz" in keys
    assert {"ckpt/step-20-rank-0.txt", "ckpt/step-20-rank-1.txt"} <= keys


def test_processes_per_host_defaults_to_this_machines_gpus_on_both_sides(monkeypatch, tmp_path):
    from meshtrain import targets
    from meshtrain.backends.hosts.layout import JobDirectory
    from meshtrain.backends.local import supervisor
    from meshtrain.contract.env import MESHTRAIN_NUM_GPUS

    monkeypatch.delenv(MESHTRAIN_NUM_GPUS, raising=False)
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("")
    cell = {"entry_point": "train.py", "source_dir": str(source), "instance_type": "local",
            "distribution": {"torch_distributed": {"enabled": True}}}
    for gpus, per_host in ((0, 1), (2, 2)):  # CPU: 1; else one process per GPU
        monkeypatch.setattr(targets, "local_gpu_count", lambda gpus=gpus: gpus)
        monkeypatch.setattr(supervisor, "local_gpu_count", lambda gpus=gpus: gpus)
        estimator = PyTorch(instance_count=2, **cell)
        assert estimator.world_size == 2 * per_host
        spec = estimator.build_spec(job_name="gpus")
        env = supervisor.host_environment(spec, JobDirectory(tmp_path / "job"), "algo-1", 1, "t")
        assert env[MESHTRAIN_NUM_GPUS] == str(gpus)  # the hosts count what the client counted
