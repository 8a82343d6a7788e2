"""fit() on ml.* against moto over HTTP: the CreateTrainingJob request as it reached the server,
field by field against golden files written by hand from the SageMaker SDK v2's encoding, the
source tarball in S3, the default bucket and the order of the AWS calls."""

from __future__ import annotations

import io
import json
import logging
import tarfile
from pathlib import Path

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from sagemaker_moto import DEFAULT_BUCKET, REGION, ROLE, sagemaker_backend

import meshtrain
from meshtrain import ConfigError, Estimator
from meshtrain.backends.sagemaker.metrics import metric_definitions, with_standard_definitions
from meshtrain.contract.metrics import STANDARD_METRICS

GOLDEN = Path(__file__).parent / "golden"
DLC_IMAGE = ("pytorch-training:"
             "2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker")
SMP_IMAGE = ("smdistributed-modelparallel:"
             "2.4.1-gpu-py311-cu121")
SMP = {"torch_distributed": {"enabled": True},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 8, "tensor_parallel_degree": 2,
           "sm_activation_offloading": False}}}}


def golden(name: str) -> dict:
    text = (GOLDEN / f"{name}.json").read_text()
    expected = json.loads(text.replace("@MESHTRAIN_VERSION@", meshtrain.__version__))
    expected.pop("_how")
    return expected


def assert_fields_match(actual: dict, expected: dict) -> None:
    """Every top-level field equal; the message names the first differing ones."""
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    assert not missing and not extra, f"missing fields {missing}, unexpected fields {extra}"
    for field, value in expected.items():
        if isinstance(value, dict):
            assert actual[field].keys() == value.keys(), field
            for key in value:
                assert actual[field][key] == value[key], f"{field}.{key}"
        assert actual[field] == value, field


def sent_request(server) -> dict:
    """The CreateTrainingJob request as it reached the server."""
    (create,) = server.find("SageMaker.CreateTrainingJob")
    return create.json()


def assert_sdk_request(server, name: str) -> None:
    """The request equals golden file `name` (the SDK's encoding) but for one intended
    difference: meshtrain appends the standard metrics' definitions the user left free."""
    expected, request = golden(name), sent_request(server)
    user = expected["AlgorithmSpecification"].get("MetricDefinitions", [])
    sent = request["AlgorithmSpecification"].pop("MetricDefinitions")
    assert sent == with_standard_definitions(user)
    assert [d["Name"] for d in sent[len(user):]] == [
        n for n in STANDARD_METRICS if n not in {d["Name"] for d in user}]
    if user:
        request["AlgorithmSpecification"]["MetricDefinitions"] = sent[: len(user)]
    assert_fields_match(request, expected)


def test_no_distribution_matches_the_sdk_encoding(aws, source):
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE,
                          instance_type="ml.g5.2xlarge", image_uri=DLC_IMAGE,
                          hyperparameters={"epochs": 3, "lr": 0.001, "model": "llama",
                                           "use_bf16": True})
    job = estimator.fit("s3://training-data-bucket/datasets/train", job_name="golden-none",
                        wait=False)
    assert_sdk_request(aws, "none")
    assert job.name == "golden-none"
    # the default bucket: checked with the expected owner, created, then the code, then the job
    ops = aws.operations()
    assert ops == ["GetCallerIdentity", f"S3 HEAD /{DEFAULT_BUCKET}", f"S3 PUT /{DEFAULT_BUCKET}",
                   f"S3 PUT /{DEFAULT_BUCKET}/golden-none/source/sourcedir.tar.gz",
                   "SageMaker.CreateTrainingJob"]
    (head,) = aws.find(f"S3 HEAD /{DEFAULT_BUCKET}")
    assert head.headers["x-amz-expected-bucket-owner"] == "123456789012"
    (put,) = aws.find(f"S3 PUT /{DEFAULT_BUCKET}/golden-none/source/sourcedir.tar.gz")
    assert put.headers["x-amz-server-side-encryption"] == "aws:kms"
    assert put.headers["x-amz-expected-bucket-owner"] == "123456789012"


def test_torch_distributed_matches_the_sdk_encoding(aws, source, tmp_path, monkeypatch):
    # no image_uri: the job uses meshtrain's image, named once by MESHTRAIN_IMAGE_URI
    monkeypatch.setenv("MESHTRAIN_IMAGE_URI", f"meshtrain:{meshtrain.__version__}")
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "helpers.py").write_text("X = 1\n")
    estimator = Estimator(
        "train.py", source_dir=str(source), dependencies=[str(lib)], role=ROLE,
        instance_type="ml.p5.48xlarge", instance_count=4,
        distribution={"torch_distributed": {"enabled": True}},
        hyperparameters={"batch_size": 32, "schedule": {"warmup": 100, "decay": "cosine"},
                         "layers": [1, 2]},
        input_mode="FastFile", container_log_level=logging.DEBUG, volume_size=200, max_run=7200,
        subnets=["subnet-0abc"], security_group_ids=["sg-0def"],
        encrypt_inter_container_traffic=True, max_retry_attempts=3, disable_profiler=True)
    estimator.fit(job_name="golden-torchrun", wait=False)
    assert_sdk_request(aws, "torch_distributed")


def test_smp_v2_matches_the_sdk_encoding(aws, source):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="my-output-bucket",
                     CreateBucketConfiguration={"LocationConstraint": REGION})
    aws.requests.clear()
    estimator = Estimator(
        "train.py", source_dir=str(source), role=ROLE, instance_type="ml.p4d.24xlarge",
        instance_count=2, image_uri=SMP_IMAGE, distribution=SMP,
        hyperparameters={"epochs": 2, "model_name": "llama3-8b"},
        output_path="s3://my-output-bucket/llama",
        checkpoint_s3_uri="s3://my-checkpoints-bucket/llama/ckpt",
        checkpoint_local_path="/opt/ml/checkpoints", use_spot_instances=True, max_run=3600,
        max_wait=7200, environment={"NCCL_DEBUG": "INFO"}, tags=[{"Key": "team", "Value": "nlp"}],
        metric_definitions=metric_definitions("train:loss"), volume_size=500)
    inputs = {"train": "s3://training-data-bucket/llama/train",
              "validation": {"uri": "s3://training-data-bucket/llama/val",
                             "content_type": "application/x-parquet"}}
    estimator.fit(inputs, job_name="golden-smp-v2", wait=False)
    assert_sdk_request(aws, "smp_v2")
    # output_path given: no account lookup, no default bucket; code in the output bucket
    assert aws.operations() == ["S3 PUT /my-output-bucket/golden-smp-v2/source/sourcedir.tar.gz",
                                "SageMaker.CreateTrainingJob"]


def tar_members(bucket: str, key: str) -> tuple[list[str], dict[str, bytes]]:
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = tar.getnames()
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return names, files


def test_source_tarball_holds_exactly_the_code(aws, source, tmp_path):
    lib = tmp_path / "mylib"
    (lib / "__pycache__").mkdir(parents=True)
    (lib / "helpers.py").write_text("X = 1\n")
    (lib / "__pycache__" / "helpers.cpython-311.pyc").write_text("junk")
    estimator = Estimator("train.py", source_dir=str(source), dependencies=[str(lib)],
                          role=ROLE, instance_type="ml.g5.2xlarge", image_uri=DLC_IMAGE)
    estimator.fit(job_name="tarball-job", wait=False)
    names, files = tar_members(DEFAULT_BUCKET, "tarball-job/source/sourcedir.tar.gz")
    assert sorted(names) == ["mylib", "mylib/helpers.py", "pkg", "pkg/__init__.py",
                             "pkg/model.py", "requirements.txt", "train.py"]
    assert files["train.py"] == b"print('training')\n"
    assert files["mylib/helpers.py"] == b"X = 1\n"
    # deterministic: the same code gives the same bytes under another job name
    estimator.fit(job_name="tarball-job-2", wait=False)
    s3 = boto3.client("s3")
    first, second = (s3.get_object(Bucket=DEFAULT_BUCKET, Key=f"{job}/source/sourcedir.tar.gz")
                     ["Body"].read() for job in ("tarball-job", "tarball-job-2"))
    assert first == second


def test_entry_point_without_source_dir_uploads_the_script_alone(aws, source):
    Estimator(str(source / "train.py"), role=ROLE, instance_type="ml.g5.2xlarge",
              image_uri=DLC_IMAGE).fit(job_name="lone-script", wait=False)
    names, _ = tar_members(DEFAULT_BUCKET, "lone-script/source/sourcedir.tar.gz")
    assert names == ["train.py"]


def test_existing_default_bucket_is_reused(aws, source):
    boto3.client("s3").create_bucket(Bucket=DEFAULT_BUCKET,
                                     CreateBucketConfiguration={"LocationConstraint": REGION})
    aws.requests.clear()
    Estimator("train.py", source_dir=str(source), role=ROLE, instance_type="ml.g5.2xlarge",
              image_uri=DLC_IMAGE).fit(job_name="reuse-bucket", wait=False)
    assert f"S3 PUT /{DEFAULT_BUCKET}" not in aws.operations()
    assert f"S3 HEAD /{DEFAULT_BUCKET}" in aws.operations()


def test_default_bucket_owned_by_another_account_is_refused(aws, source):
    """The expected-owner check fails (S3 answers 403): nothing is uploaded, no job created."""
    session = boto3.Session()

    class EmptyBody:
        def stream(self):
            return iter([b""])

    def answer_forbidden(request, **_):
        if request.headers.get("x-amz-expected-bucket-owner"):
            return AWSResponse(request.url, 403, {}, EmptyBody())
        return None

    session.events.register("before-send.s3.HeadBucket", answer_forbidden)
    estimator = Estimator("train.py", source_dir=str(source), role=ROLE,
                          instance_type="ml.g5.2xlarge", image_uri=DLC_IMAGE,
                          boto_session=session)
    with pytest.raises(ConfigError, match="expected-owner check"):
        estimator.fit(job_name="sniped", wait=False)
    assert not any(op.startswith(("S3 PUT", "SageMaker")) for op in aws.operations())


def test_boto_session_picks_region_and_role_name_is_expanded(aws, source):
    session = boto3.Session(region_name="eu-west-1")
    session.client("iam").create_role(RoleName="TrainerRole", AssumeRolePolicyDocument="{}")
    estimator = Estimator("train.py", source_dir=str(source), role="TrainerRole",
                          instance_type="ml.g5.2xlarge", image_uri=DLC_IMAGE,
                          boto_session=session)
    estimator.fit(job_name="eu-job", wait=False)
    request = sent_request(aws)
    assert request["RoleArn"] == "arn:aws:iam::123456789012:role/TrainerRole"
    assert request["OutputDataConfig"]["S3OutputPath"] == (
        "s3://sagemaker-eu-west-1-123456789012/")
    assert request["HyperParameters"]["sagemaker_region"] == '"eu-west-1"'
    assert "eu-job" in sagemaker_backend("eu-west-1").training_jobs


def test_network_isolation_sends_the_code_as_a_channel(aws, source):
    Estimator("train.py", source_dir=str(source), role=ROLE, instance_type="ml.g5.2xlarge",
              image_uri=DLC_IMAGE, enable_network_isolation=True).fit(
        "s3://training-data-bucket/d", job_name="isolated", wait=False)
    request = sent_request(aws)
    assert request["EnableNetworkIsolation"] is True
    assert request["HyperParameters"]["sagemaker_submit_directory"] == (
        '"/opt/ml/input/data/code/sourcedir.tar.gz"')
    code = request["InputDataConfig"][-1]
    assert code["ChannelName"] == "code"
    assert code["DataSource"]["S3DataSource"]["S3Uri"] == (
        f"s3://{DEFAULT_BUCKET}/isolated/source/sourcedir.tar.gz")
