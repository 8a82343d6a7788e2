"""Invalid SageMaker arguments are ConfigErrors raised before any AWS request: moto's request
log stays empty (and does record the requests of a valid job, so the check can fail)."""

from __future__ import annotations

import boto3
import pytest
from sagemaker_moto import ROLE

from meshtrain import ConfigError, Estimator
from meshtrain.backends.sagemaker import SageMakerBackend
from meshtrain.contract.jobspec import JobSpec

IMAGE = "pytorch-training:2.5.1-gpu-py311"
SMP = {"torch_distributed": {"enabled": True}}


def smp(**parameters):
    return {**SMP, "smdistributed": {"modelparallel": {"enabled": True,
                                                       "parameters": parameters}}}


# name -> (Estimator arguments, fit arguments, part of the message)
CASES = {
    "job-name-underscore": ({}, {"job_name": "my_job"}, "not a valid SageMaker job name"),
    "job-name-64-chars": ({}, {"job_name": "a" * 64}, "1-63 letters"),
    "job-name-trailing-hyphen": ({}, {"job_name": "job-"}, "not a valid SageMaker job name"),
    "role-missing": ({"role": None}, {}, "role is required"),
    "role-short-account": ({"role": "arn:aws:iam::1234:role/R"}, {}, "neither an IAM role ARN"),
    "101-hyperparameters": ({"hyperparameters": {f"h{i}": i for i in range(96)}}, {},
                            "101 hyperparameters (96 yours + 5 sagemaker_* entries) exceed"),
    "hyperparameter-2501-chars": ({"hyperparameters": {"prompt": "x" * 2499}}, {},
                                  "is 2501 characters once JSON-encoded"),
    "file-input": ({}, {"inputs": "file:///data/train"}, "File URIs work in local mode only"),
    "local-path-input": ({}, {"inputs": {"train": "data/train"}}, "must be an S3 URI"),
    "output-not-s3": ({"output_path": "my-bucket/out"}, {}, "output_path='my-bucket/out'"),
    "checkpoint-bad-bucket": ({"checkpoint_s3_uri": "s3://Bad_Bucket/ckpt"}, {},
                              "not a valid S3 bucket name"),
    "checkpoint-local-relative": ({"checkpoint_local_path": "ckpt"}, {}, "absolute path"),
    "unknown-instance-type": ({"instance_type": "ml.p9.48xlarge"}, {},
                              "Unknown instance type 'ml.p9.48xlarge'"),
    "tp-vs-gpus": ({"instance_count": 2, "distribution": smp(tensor_parallel_degree=3)}, {},
                   "tensor_parallel_degree=3 does not divide world size 16"),
    "shard-vs-gpus": ({"distribution": smp(hybrid_shard_degree=16)}, {},
                      "hybrid_shard_degree=16"),
    "spot-wait-too-short": ({"use_spot_instances": True, "max_run": 7200, "max_wait": 3600}, {},
                            "max_wait=3600 must be an int >= max_run=7200"),
    "max-wait-without-spot": ({"max_run": 3600, "max_wait": 7200}, {},
                              "managed spot training only"),
    "max-run-over-28-days": ({"max_run": 29 * 24 * 3600}, {}, "28 days"),
    "input-mode": ({"input_mode": "Stream"}, {}, "input_mode='Stream'"),
    "unknown-option": ({"subnet": ["subnet-1"]}, {}, "Did you mean 'subnets'"),
    "subnets-alone": ({"subnets": ["subnet-1"]}, {}, "subnets and security_group_ids go together"),
    "retries-zero": ({"max_retry_attempts": 0}, {}, "from 1 to 30"),
    "bad-tag": ({"tags": [{"key": "team", "value": "nlp"}]}, {}, "must be {'Key'"),
    "bad-metric-regex": ({"metric_definitions": [{"Name": "loss", "Regex": "loss=(["}]}, {},
                         "Regex is not valid"),
    "environment-value-too-long": ({"environment": {"TOKEN": "x" * 513}}, {},
                                   "values up to 512"),
    "image-uri-too-long": ({"image_uri": "x" * 256}, {}, "allows 1-255"),
    "no-image": ({"image_uri": None}, {}, "image_uri is required for SageMaker jobs"),
}


def build(source, arguments):
    base = {"entry_point": "train.py", "source_dir": str(source), "role": ROLE,
            "instance_type": "ml.p4d.24xlarge", "image_uri": IMAGE}
    return Estimator(**{**base, **arguments})


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_argument_is_rejected_before_any_request(aws, source, case, monkeypatch):
    monkeypatch.delenv("MESHTRAIN_IMAGE_URI", raising=False)
    arguments, fit_arguments, message = CASES[case]
    fit_arguments = {"job_name": "valid-name", "wait": False, **fit_arguments}
    with pytest.raises(ConfigError) as error:
        build(source, arguments).fit(**fit_arguments)
    assert message in str(error.value)
    assert aws.requests == [], f"{case}: requests reached moto: {aws.operations()}"


def test_no_region_is_rejected_before_any_request(aws, source, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    estimator = build(source, {"boto_session": boto3.Session()})
    with pytest.raises(ConfigError, match="No AWS region is configured"):
        estimator.fit(job_name="no-region", wait=False)
    assert aws.requests == []


def test_s3_source_dir_must_be_a_tarball(aws):
    """A JobSpec (as attach() rebuilds it) whose source is in S3 is checked the same way."""
    spec = JobSpec(job_name="from-s3", entry_point="train.py", source_dir="s3://code-bucket/src",
                   instance_type="ml.p4d.24xlarge", role=ROLE, image_uri=IMAGE)
    with pytest.raises(ConfigError, match=r"must name a tar\.gz file"):
        SageMakerBackend().validate(spec)
    assert aws.requests == []


def test_at_least_fifteen_distinct_checks():
    assert len(CASES) >= 15


def test_a_valid_job_does_reach_moto(aws, source):
    """The control: the same construction with valid arguments makes requests moto logs."""
    build(source, {}).fit(job_name="valid-name", wait=False)
    assert "SageMaker.CreateTrainingJob" in aws.operations()
