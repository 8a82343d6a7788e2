"""Estimator.attach(job_name) for a SageMaker job rebuilds the estimator from
DescribeTrainingJob (source in S3), and the rebuilt estimator can start the job again."""

from __future__ import annotations

import pytest
from sagemaker_moto import DEFAULT_BUCKET, ROLE

from meshtrain import ConfigError, Estimator
from meshtrain.backends.sagemaker.job import SageMakerTrainingJob

IMAGE = "pytorch-training:2.5.1-gpu-py311"
SMP = {"torch_distributed": {"enabled": True},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 8, "tensor_parallel_degree": 2}}}}
CODE = f"s3://{DEFAULT_BUCKET}/first-run/source/sourcedir.tar.gz"


def test_attach_rebuilds_the_estimator_and_refits_from_s3(aws, source, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))  # no local job of that name
    original = Estimator("train.py", source_dir=str(source), role=ROLE,
                         instance_type="ml.p4d.24xlarge", instance_count=2, image_uri=IMAGE,
                         distribution=SMP, hyperparameters={"epochs": 2}, max_run=3600,
                         volume_size=100)
    original.fit("s3://training-data-bucket/train", job_name="first-run", wait=False)

    attached = Estimator.attach("first-run")
    assert isinstance(attached.latest_training_job, SageMakerTrainingJob)
    assert attached.latest_training_job.name == "first-run"
    assert attached.model_data == f"s3://{DEFAULT_BUCKET}/first-run/output/model.tar.gz"
    assert (attached.source_dir, attached.entry_point) == (CODE, "train.py")
    for name in ("hyperparameters", "distribution", "instance_type", "instance_count", "role",
                 "image_uri", "max_run", "volume_size", "input_mode", "container_log_level"):
        assert getattr(attached, name) == getattr(original, name), name

    aws.requests.clear()
    attached.fit("s3://training-data-bucket/train", job_name="second-run", wait=False)
    assert not any(op.startswith("S3 PUT") for op in aws.operations())  # the code is reused
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    assert create.json()["HyperParameters"]["sagemaker_submit_directory"] == f'"{CODE}"'


def test_attach_to_an_unknown_job(aws, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match="no SageMaker training job named 'ghost'"):
        Estimator.attach("ghost")
