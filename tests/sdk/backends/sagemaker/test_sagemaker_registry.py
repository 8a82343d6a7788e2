"""A SageMaker job found by name through the job registry (moto): Estimator.attach and
`meshtrain status|describe|logs|stop`; a name on two backends is an error listing both; AWS that
cannot be reached is named in the not-found message, without a traceback; processes_per_host
above the instance's GPUs is refused before any request."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import boto3
import pytest
from sagemaker_moto import ROLE
from test_sagemaker_job import put_logs, set_status, utc

from meshtrain import ConfigError, Estimator
from meshtrain.backends.sagemaker.job import SageMakerTrainingJob
from meshtrain.backends.sagemaker.logs import LOG_GROUP
from meshtrain.cli import main

IMAGE = "pytorch-training:2.5.1-gpu-py311"


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))


def submit(source, name: str, **arguments) -> Estimator:
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE, image_uri=IMAGE,
                          instance_type="ml.p4d.24xlarge", **arguments)
    estimator.fit(job_name=name, wait=False)
    return estimator


def test_a_finished_sagemaker_job_by_name(aws, source, no_cluster, capsys, stop_training_job):
    submit(source, "done-job", hyperparameters={"max_steps": 4})
    set_status("done-job", "Completed", "Completed", "Training job completed", utc(4, 0),
               training_end_time=utc(4, 0))
    boto3.client("logs").create_log_group(logGroupName=LOG_GROUP)
    put_logs({"done-job/algo-1-1767322800": [(0, "[algo-1 rank 0] hello from SageMaker")]})
    capsys.readouterr()

    attached = Estimator.attach("done-job")
    assert isinstance(attached.latest_training_job, SageMakerTrainingJob)
    assert main(["status", "done-job"]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobStatus"] == "Completed"
    assert main(["describe", "done-job"]) == 0
    view = capsys.readouterr().out.splitlines()
    assert "Job:       done-job" in view and "Instances: 1 x ml.p4d.24xlarge" in view
    assert main(["logs", "done-job", "--follow"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[algo-1 rank 0] hello from SageMaker", "===== Job Completed ====="]
    assert main(["stop", "done-job"]) == 0
    assert "already ended (Completed)" in capsys.readouterr().out
    assert stop_training_job == []  # an ended job is not stopped again


def test_a_name_on_two_backends_is_an_error_listing_both(aws, source, no_cluster, tmp_path,
                                                         capsys):
    submit(source, "twin")
    local = tmp_path / "local-src"
    local.mkdir()
    (local / "train.py").write_text("print('local twin')\n")
    Estimator("train.py", source_dir=str(local)).fit(job_name="twin", logs=False)
    with pytest.raises(ConfigError) as error:
        Estimator.attach("twin")
    assert "2 jobs are named 'twin'" in str(error.value)
    assert "local (LocalTrainingJob('twin'))" in str(error.value)
    assert "SageMaker (SageMakerTrainingJob('twin'))" in str(error.value)
    assert "--backend local or --backend sagemaker" in str(error.value)
    attached = Estimator.attach("twin", backend="sagemaker")
    assert isinstance(attached.latest_training_job, SageMakerTrainingJob)
    capsys.readouterr()
    assert main(["status", "twin", "--backend", "local"]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobStatus"] == "Completed"


def test_unreachable_aws_is_named_in_one_line_without_a_traceback(aws, tmp_path):
    with socket.socket() as sock:  # a port nothing listens on: AWS cannot be reached
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "AWS_ENDPOINT_URL": dead, "MESHTRAIN_HOME": str(tmp_path / "home"),
           "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    for command in ("status", "stop", "logs"):
        done = subprocess.run([sys.executable, "-m", "meshtrain.cli", command, "ghost"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"meshtrain: no local job ghost under {tmp_path}/home/jobs")
        assert "not searched: SageMaker (AWS could not be reached: " in done.stderr
        assert dead in done.stderr


def test_processes_above_the_instances_gpus_are_refused_before_any_request(aws, source):
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE, image_uri=IMAGE,
                          instance_type="ml.g5.2xlarge", distribution={
                              "torch_distributed": {"enabled": True, "processes_per_host": 2}})
    aws.requests.clear()
    with pytest.raises(ConfigError) as error:
        estimator.fit(job_name="too-many", wait=False)
    assert str(error.value) == (
        "processes_per_host=2 exceeds the 1 GPUs of ml.g5.2xlarge: each process needs a GPU of "
        "its own on SageMaker. Use processes_per_host=1 or fewer (or leave it out: one process "
        "per GPU), or an instance type with more GPUs.")
    assert aws.requests == []
