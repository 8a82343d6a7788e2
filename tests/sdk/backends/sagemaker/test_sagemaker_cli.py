"""`meshtrain list --sagemaker` and `meshtrain status NAME` for SageMaker jobs, against moto."""

from __future__ import annotations

import json

from sagemaker_moto import REGION, ROLE, sagemaker_backend

from meshtrain import Estimator
from meshtrain.cli import main

IMAGE = "pytorch-training:2.5.1-gpu-py311"


def submit(source, name: str) -> None:
    Estimator("train.py", source_dir=str(source), role=ROLE, image_uri=IMAGE,
              instance_type="ml.p4d.24xlarge").fit(job_name=name, wait=False)


def test_list_sagemaker_shows_remote_jobs_newest_first(aws, source, capsys, tmp_path,
                                                       monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    submit(source, "older-job")
    submit(source, "newer-job")
    capsys.readouterr()
    aws.requests.clear()
    assert main(["list", "--sagemaker"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT", "REASON"]
    assert [line.split()[0] for line in lines[1:]] == ["newer-job", "older-job"]
    assert all(line.split()[-1] == "-" for line in lines[1:])  # a listing carries no script
    jobs = sagemaker_backend().training_jobs
    assert all(line.split()[1] == jobs[line.split()[0]].training_job_status
               for line in lines[1:])
    assert aws.operations() == ["SageMaker.ListTrainingJobs"]
    assert main(["list"]) == 0  # local jobs: none here, and no AWS request for them
    assert capsys.readouterr().out.strip() == f"no jobs under {tmp_path}/home/jobs"
    assert aws.operations() == ["SageMaker.ListTrainingJobs"]


def test_status_of_a_sagemaker_job_and_an_unknown_one(aws, source, capsys, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    submit(source, "remote-job")
    capsys.readouterr()
    assert main(["status", "remote-job", "--region", REGION]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobName"] == "remote-job"
    assert main(["status", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"meshtrain: no local job nope under {tmp_path}/home/jobs, and no "
                          "SageMaker training job named 'nope'")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
