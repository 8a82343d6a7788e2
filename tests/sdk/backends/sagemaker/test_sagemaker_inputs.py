"""Drop-in channel objects and images from versions, against moto over HTTP.

`meshtrain.sagemaker.TrainingInput` / `FileSystemInput` carry every option into the request as
the SDK v2 carries them (its `inputs.py` builds the same `config`); invalid values and
combinations are ConfigErrors before any request; `framework_version` + `py_version` choose AWS's
image (SMP v2's with an SMP distribution) from the packaged table.
"""

from __future__ import annotations

import json

import pytest
from sagemaker_moto import REGION, ROLE

from meshtrain import ConfigError, Estimator
from meshtrain.backends.sagemaker.images import image_table, training_image_uri
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.instances import instance_spec
from meshtrain.sagemaker import FileSystemInput, PyTorch, ShuffleConfig, TrainingInput

SMP = {"torch_distributed": {"enabled": True},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 8, "tensor_parallel_degree": 1}}}}
VPC = {"subnets": ["subnet-0abc"], "security_group_ids": ["sg-0abc"]}
FSX = ("fs-0123456789abcdef0", "FSxLustre", "/abcdefgh/data")


def sent_request(server) -> dict:
    (create,) = server.find("SageMaker.CreateTrainingJob")
    return create.json()


def estimator(source, **extra) -> Estimator:
    arguments = {"role": ROLE, "instance_type": "ml.p4d.24xlarge", "framework_version": "2.5.1",
                 "py_version": "py311", **extra}
    return PyTorch("train.py", source_dir=str(source), **arguments)


def test_pytorch_is_the_estimator():
    assert PyTorch is Estimator


def test_every_training_input_option_and_fsx_reach_the_request(aws, source):
    inputs = {
        "train": TrainingInput("s3://data-bucket/train", distribution="ShardedByS3Key",
                               input_mode="FastFile", content_type="application/x-parquet",
                               shuffle_config=ShuffleConfig(42)),
        "manifest": TrainingInput("s3://data-bucket/aug.manifest", input_mode="Pipe",
                                  s3_data_type="AugmentedManifestFile", compression="Gzip",
                                  record_wrapping="RecordIO", attribute_names=["source-ref"]),
        "fsx": FileSystemInput(*FSX, file_system_access_mode="rw", content_type="text/plain"),
        "weights": TrainingInput("s3://data-bucket/weights", model_access_config={
            "AcceptEula": True}),
    }
    estimator(source, **VPC).fit(inputs, job_name="inputs", wait=False)
    channels = {c["ChannelName"]: c for c in sent_request(aws)["InputDataConfig"]}
    assert channels["train"] == {
        "ChannelName": "train", "ContentType": "application/x-parquet", "InputMode": "FastFile",
        "ShuffleConfig": {"Seed": 42},
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data-bucket/train",
                                        "S3DataDistributionType": "ShardedByS3Key"}}}
    assert channels["manifest"] == {
        "ChannelName": "manifest", "CompressionType": "Gzip", "RecordWrapperType": "RecordIO",
        "InputMode": "Pipe",
        "DataSource": {"S3DataSource": {
            "S3DataType": "AugmentedManifestFile", "S3Uri": "s3://data-bucket/aug.manifest",
            "S3DataDistributionType": "FullyReplicated", "AttributeNames": ["source-ref"]}}}
    assert channels["weights"]["DataSource"]["S3DataSource"] == {
        "S3DataType": "S3Prefix", "S3Uri": "s3://data-bucket/weights",
        "S3DataDistributionType": "FullyReplicated", "ModelAccessConfig": {"AcceptEula": True}}
    assert channels["fsx"] == {
        "ChannelName": "fsx", "ContentType": "text/plain",
        "DataSource": {"FileSystemDataSource": {
            "FileSystemId": FSX[0], "FileSystemType": "FSxLustre", "DirectoryPath": FSX[2],
            "FileSystemAccessMode": "rw"}}}


def test_a_single_file_system_input_is_channel_training_and_attach_keeps_it(aws, source):
    job = estimator(source, **VPC).fit(FileSystemInput(*FSX), job_name="fsx-only", wait=False)
    (channel,) = sent_request(aws)["InputDataConfig"]
    assert channel["ChannelName"] == "training"
    assert "FileSystemDataSource" in channel["DataSource"]
    again = Estimator.attach(job.job_name)
    assert again.latest_training_job is not None
    spec = again.backend.load_spec(job.job_name)
    assert spec.inputs == {"training": "fsxlustre://fs-0123456789abcdef0/abcdefgh/data"}
    assert spec.input_configs["training"] == {k: v for k, v in channel.items()
                                              if k != "ChannelName"}


@pytest.mark.parametrize(("build", "message"), [
    (lambda: TrainingInput("s3://b/x", distribution="Sharded"), "ShardedByS3Key"),
    (lambda: TrainingInput("s3://b/x", s3_data_type="Manifest"), "AugmentedManifestFile"),
    (lambda: TrainingInput("s3://b/x", input_mode="Stream"), "FastFile"),
    (lambda: TrainingInput("s3://b/x", compression="zip"), "Gzip"),
    (lambda: TrainingInput("s3://b/x", attribute_names=["a"]), "AugmentedManifestFile"),
    (lambda: ShuffleConfig("7"), "int"),
    (lambda: TrainingInput("s3://b/x", instance_groups=["g"]), "heterogeneous cluster"),
    (lambda: FileSystemInput("fs-1", "FSxLustre", "/d"), "fs- then 8-40 hex"),
    (lambda: FileSystemInput(FSX[0], "Lustre", "/d"), "FSxLustre, EFS"),
    (lambda: FileSystemInput(FSX[0], "EFS", "data"), "absolute path"),
    (lambda: FileSystemInput(FSX[0], "EFS", "/data", "w"), "ro, rw"),
])
def test_invalid_channel_objects_fail_when_built(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


@pytest.mark.parametrize(("inputs", "extra", "message"), [
    (TrainingInput("s3://b/x", compression="Gzip"), VPC, "only in Pipe mode"),
    (FileSystemInput(*FSX), {}, "subnets=.* and security_group_ids"),
    (FileSystemInput(*FSX), {**VPC, "input_mode": "FastFile"}, "must be 'File'"),
])
def test_invalid_combinations_fail_before_any_request(aws, source, inputs, extra, message):
    with pytest.raises(ConfigError, match=message):
        estimator(source, **extra).fit(inputs, job_name="bad", wait=False)
    assert aws.operations() == []


def test_images_come_from_the_versions(aws, source):
    estimator(source, instance_type="ml.g5.2xlarge").fit(job_name="plain", wait=False)
    request = sent_request(aws)
    account = image_table()["registries"][
        image_table()["frameworks"]["pytorch"]["versions"]["2.5.1"]["registries"]][REGION]
    assert request["AlgorithmSpecification"]["TrainingImage"] == (
        f"{account}.dkr.ecr.{REGION}.amazonaws.com/pytorch-training:2.5.1-gpu-py311")
    assert request["AlgorithmSpecification"]["EnableSageMakerMetricsTimeSeries"] is True


@pytest.mark.parametrize(("version", "instance", "tag"), [
    ("2.5.1", "ml.p4d.24xlarge", "2.5.1-gpu-py311-cu124"),
    ("2.4.1", "ml.p4d.24xlarge", "2.4.1-gpu-py311-cu121"),
    ("2.0.1", "ml.p4d.24xlarge", "2.0.1-gpu-py310-cu118"),
    ("2.0.1", "ml.p5.48xlarge", "2.0.1-gpu-py310-cu121"),
])
def test_smp_distributions_get_the_smp_image(version, instance, tag):
    py = "py310" if version == "2.0.1" else "py311"
    row, smp = instance_spec(instance), DistributionConfig.from_dict(SMP)
    uri = training_image_uri("us-east-1", version, py, row, smp)
    assert uri.endswith(f".dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:{tag}")
    assert training_image_uri("cn-north-1", "2.5.1", "py311", row).endswith(
        ".dkr.ecr.cn-north-1.amazonaws.com.cn/pytorch-training:2.5.1-gpu-py311")


@pytest.mark.parametrize(("extra", "message"), [
    ({"framework_version": "9.9.9"}, r"Known versions: .*2\.5\.1"),
    ({"framework_version": "2.5.1", "py_version": "py27"}, "known py311"),
    ({"py_version": None}, "need framework_version and py_version"),
    ({"framework_version": "2.6", "distribution": {"torch_distributed": {"enabled": True}}},
     "not supported by torch_distributed"),
])
def test_unknown_versions_fail_before_any_request(aws, source, extra, message):
    with pytest.raises(ConfigError, match=message):
        estimator(source, **extra).fit(job_name="bad", wait=False)
    assert aws.operations() == []


def uploaded_members(job_name: str) -> dict[str, bytes]:
    import io
    import tarfile

    import boto3

    from meshtrain.backends.sagemaker.checks import parse_s3_uri

    description = boto3.client("sagemaker").describe_training_job(TrainingJobName=job_name)
    uri = json.loads(description["HyperParameters"]["sagemaker_submit_directory"])
    bucket, key = parse_s3_uri(uri, "code")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_runtime_ships_with_the_code_for_aws_images_only(aws, source):
    estimator(source).fit(job_name="aws-image", wait=False)
    members = uploaded_members("aws-image")
    assert "meshtrain_runtime/__init__.py" in members
    assert "meshtrain/contract/jobspec.py" in members and "meshtrain/__init__.py" in members
    assert not any(name.startswith("meshtrain/backends") for name in members)
    assert members["requirements.txt"] == b"numpy\n# meshtrain runtime\npydantic>=2.6\n"
    assert (source / "requirements.txt").read_text() == "numpy\n"  # the user's file unchanged
    Estimator("train.py", source_dir=str(source), role=ROLE, instance_type="ml.g5.2xlarge",
              image_uri="111122223333.dkr.ecr.us-west-2.amazonaws.com/meshtrain:0.1.0").fit(
        job_name="own-image", wait=False)
    members = uploaded_members("own-image")
    assert not any(name.startswith("meshtrain") for name in members)
    assert members["requirements.txt"] == b"numpy\n"
