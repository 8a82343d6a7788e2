"""The request builder's SageMaker-only options, field by field (pure: no AWS)."""

from __future__ import annotations

import pytest

from meshtrain import ConfigError
from meshtrain.backends.sagemaker.options import build_options
from meshtrain.backends.sagemaker.request import (
    RequestContext,
    build_training_request,
    code_uri_for,
)
from meshtrain.backends.sagemaker.spec import spec_from_description
from meshtrain.contract.jobspec import JobSpec

CTX = RequestContext(region="us-west-2", role_arn="arn:aws:iam::111122223333:role/R",
                     image_uri="img:1", output_path="s3://out-bucket/runs",
                     code_uri="s3://out-bucket/j/source/sourcedir.tar.gz")


def spec(**fields) -> JobSpec:
    return JobSpec(**{"job_name": "j", "entry_point": "train.py", "source_dir": "/src",
                      "instance_type": "ml.g5.xlarge", "role": CTX.role_arn, **fields})


def test_sdk_options_become_their_fields():
    options = build_options(output_kms_key="kms-out", volume_kms_key="kms-vol",
                            keep_alive_period_in_seconds=1800, disable_output_compression=True,
                            enable_sagemaker_metrics=True,
                            debugger_hook_config={"LocalPath": "/opt/ml/debug"})
    request = build_training_request(spec(), options, CTX)
    assert request["OutputDataConfig"] == {"S3OutputPath": "s3://out-bucket/runs",
                                           "KmsKeyId": "kms-out", "CompressionType": "NONE"}
    assert request["ResourceConfig"] == {"VolumeSizeInGB": 30, "VolumeKmsKeyId": "kms-vol",
                                         "KeepAlivePeriodInSeconds": 1800, "InstanceCount": 1,
                                         "InstanceType": "ml.g5.xlarge"}
    assert request["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is True
    assert request["DebugHookConfig"] == {"S3OutputPath": "s3://out-bucket/runs",
                                          "CollectionConfigurations": [],
                                          "LocalPath": "/opt/ml/debug"}
    assert "InputDataConfig" not in request  # no inputs: no channels (SDK sends none)


def test_debugger_off_and_regions_without_debugger_or_profiler():
    request = build_training_request(spec(), build_options(debugger_hook_config=False), CTX)
    assert "DebugHookConfig" not in request
    jakarta = RequestContext(**{**CTX.__dict__, "region": "ap-southeast-3"})
    request = build_training_request(spec(), build_options(), jakarta)
    assert "DebugHookConfig" not in request
    assert request["ProfilerConfig"] == {"DisableProfiler": True}


def test_code_location_and_output_bucket_choose_where_the_code_goes():
    with_output = spec(output_path="s3://out-bucket/deep/prefix")
    assert code_uri_for(with_output, build_options(), "default-bucket") == (
        "s3://out-bucket/j/source/sourcedir.tar.gz")
    assert code_uri_for(with_output, build_options(code_location="s3://code-bucket/team/"),
                        "default-bucket") == "s3://code-bucket/team/j/source/sourcedir.tar.gz"
    assert code_uri_for(spec(), build_options(), "default-bucket") == (
        "s3://default-bucket/j/source/sourcedir.tar.gz")
    from_s3 = spec(source_dir="s3://code-bucket/prior/sourcedir.tar.gz")
    assert code_uri_for(from_s3, build_options(), "default-bucket") == from_s3.source_dir


def test_network_isolated_request_round_trips_to_a_spec():
    original = spec(inputs={"train": "s3://data-bucket/train"},
                    distribution={"torch_distributed": {"enabled": True}})
    request = build_training_request(original, build_options(enable_network_isolation=True), CTX)
    description = {**request, "TrainingJobName": "j"}
    rebuilt = spec_from_description(description, "us-west-2")
    assert rebuilt.source_dir == CTX.code_uri
    assert rebuilt.inputs == {"train": "s3://data-bucket/train"}  # the code channel is not data
    assert rebuilt.distribution.to_dict() == {"torch_distributed": {"enabled": True}}


@pytest.mark.parametrize(("options", "message"), [
    ({"sagemaker_sesion": object()}, "Did you mean 'sagemaker_session'"),
    ({"keep_alive_period_in_seconds": 99999}, "from 0 to 21600"),
    ({"debugger_hook_config": "on"}, "debugger_hook_config must be False"),
    ({"boto_session": "default"}, "must be a boto3.Session"),
    ({"subnets": "subnet-1", "security_group_ids": ["sg-1"]}, "must be a list of ids"),
])
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        build_options(**options)
