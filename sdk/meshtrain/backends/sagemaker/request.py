"""The CreateTrainingJob request, field by field as the SageMaker Python SDK v2 builds it.

Sources (contract §2.3, §5.1): SDK v2 ``session.py::_get_train_request``,
``estimator.py::_TrainingJob._get_train_args``, ``job.py::_Job._load_config`` and the PyTorch
estimator's hyperparameters. Pure functions: no AWS calls, so golden tests can pin every field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtrain.backends.sagemaker.metrics import with_standard_definitions
from meshtrain.backends.sagemaker.options import SageMakerOptions
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.paths import DEFAULT_BASE_DIR, OptMLPaths

# With network isolation the code arrives through the "code" channel (SDK
# `CONTAINER_CODE_CHANNEL_SOURCEDIR_PATH`).
CODE_CHANNEL = "code"
NETWORK_ISOLATION_SUBMIT_DIRECTORY = str(
    OptMLPaths(Path(DEFAULT_BASE_DIR)).channel_dir("code") / "sourcedir.tar.gz")
# SDK fw_utils: regions without SageMaker Debugger / profiling.
DEBUGGER_UNSUPPORTED_REGIONS = frozenset({
    "us-iso-east-1", "us-isob-east-1", "ap-southeast-3", "ap-southeast-4", "eu-south-2",
    "me-central-1", "ap-south-2", "eu-central-2", "us-gov-east-1",
})
PROFILER_UNSUPPORTED_REGIONS = DEBUGGER_UNSUPPORTED_REGIONS


@dataclass(frozen=True)
class RequestContext:
    """What the backend resolved with AWS (or from its arguments) before building the request."""

    region: str
    role_arn: str
    image_uri: str
    output_path: str
    """S3OutputPath, e.g. 's3://sagemaker-us-west-2-111122223333/'."""
    code_uri: str
    """Where sourcedir.tar.gz is (or will be) in S3."""
    code_bucket_owner: str | None = None
    """The account that must own the code bucket (set for the derived default bucket)."""


def default_output_path(bucket: str) -> str:
    """The SDK's output path when none is given: the default bucket, with a trailing slash."""
    return f"s3://{bucket}/"


def code_uri_for(spec: JobSpec, options: SageMakerOptions, default_bucket: str) -> str:
    """s3://<bucket>/<job>/source/sourcedir.tar.gz, as SDK `_stage_user_code_in_s3` picks it.

    The bucket is code_location's, else output_path's (its prefix is not used), else the
    default bucket. An S3 source_dir is used as is (nothing is uploaded).
    """
    if spec.source_dir.startswith("s3://"):
        return spec.source_dir
    if options.code_location:
        prefix = options.code_location.removeprefix("s3://").rstrip("/")
        return f"s3://{prefix}/{spec.job_name}/source/sourcedir.tar.gz"
    bucket = default_bucket
    if spec.output_path:
        bucket = spec.output_path.removeprefix("s3://").split("/", 1)[0]
    return f"s3://{bucket}/{spec.job_name}/source/sourcedir.tar.gz"


def submit_directory(options: SageMakerOptions, code_uri: str) -> str:
    """The `sagemaker_submit_directory` hyperparameter."""
    return NETWORK_ISOLATION_SUBMIT_DIRECTORY if options.enable_network_isolation else code_uri


def s3_channel(name: str, uri: str, content_type: str | None = None) -> dict[str, Any]:
    """SDK `TrainingInput(uri)` as a Channel: S3Prefix, FullyReplicated."""
    channel: dict[str, Any] = {
        "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated",
        }},
        "ChannelName": name,
    }
    if content_type:
        channel["ContentType"] = content_type
    return channel


def channel_for(spec: JobSpec, name: str) -> dict[str, Any]:
    """One Channel: a TrainingInput/FileSystemInput's config as given (SDK
    `_convert_input_to_channel`), else the SDK's `TrainingInput(uri)`."""
    if name in spec.input_configs:
        return {**spec.input_configs[name], "ChannelName": name}
    return s3_channel(name, spec.inputs[name], spec.input_content_types.get(name))


def build_input_config(
    spec: JobSpec, options: SageMakerOptions, code_uri: str
) -> list[dict[str, Any]] | None:
    channels = [channel_for(spec, name) for name in spec.inputs]
    if options.enable_network_isolation:
        channels.append(s3_channel(CODE_CHANNEL, code_uri))
    return channels or None


def build_debug_hook_config(
    spec: JobSpec, options: SageMakerOptions, ctx: RequestContext
) -> dict[str, Any] | None:
    """SDK default: a hook writing under output_path, except where Debugger is unavailable or
    (PyTorch) when both checkpoint_s3_uri and checkpoint_local_path are set."""
    hook = options.debugger_hook_config
    if hook is False or ctx.region in DEBUGGER_UNSUPPORTED_REGIONS:
        return None
    if hook is None and spec.checkpoint_s3_uri and spec.checkpoint_local_path:
        return None
    config = {"S3OutputPath": ctx.output_path, "CollectionConfigurations": []}
    return {**config, **(hook or {})}


def build_profiler_config(options: SageMakerOptions, ctx: RequestContext) -> dict[str, Any]:
    if options.disable_profiler or ctx.region in PROFILER_UNSUPPORTED_REGIONS:
        return {"DisableProfiler": True}
    return {"S3OutputPath": ctx.output_path, "DisableProfiler": False}


def _algorithm_specification(spec: JobSpec, options: SageMakerOptions,
                             ctx: RequestContext) -> dict[str, Any]:
    algorithm: dict[str, Any] = {"TrainingInputMode": spec.input_mode,
                                 "TrainingImage": ctx.image_uri}
    # meshtrain_runtime.metrics.log() prints the standard metrics: define them for the console.
    algorithm["MetricDefinitions"] = with_standard_definitions(
        [dict(m) for m in spec.metric_definitions])
    metrics = options.enable_sagemaker_metrics
    if metrics is None and _at_least(spec.framework_version, (1, 3)):
        metrics = True  # the SDK's PyTorch estimator: on for framework_version >= 1.3
    if metrics is not None:
        algorithm["EnableSageMakerMetricsTimeSeries"] = metrics
    return algorithm


def _at_least(version: str | None, minimum: tuple[int, ...]) -> bool:
    if not version:
        return False
    parts = tuple(int(p) for p in version.split(".") if p.isdigit())
    return parts >= minimum


def _resource_config(spec: JobSpec, options: SageMakerOptions) -> dict[str, Any]:
    resources: dict[str, Any] = {"VolumeSizeInGB": spec.volume_size}
    if options.volume_kms_key is not None:
        resources["VolumeKmsKeyId"] = options.volume_kms_key
    if options.keep_alive_period_in_seconds is not None:
        resources["KeepAlivePeriodInSeconds"] = options.keep_alive_period_in_seconds
    resources["InstanceCount"] = spec.instance_count
    resources["InstanceType"] = spec.instance_type
    return resources


def _output_config(options: SageMakerOptions, ctx: RequestContext) -> dict[str, Any]:
    output: dict[str, Any] = {"S3OutputPath": ctx.output_path}
    if options.output_kms_key is not None:
        output["KmsKeyId"] = options.output_kms_key
    if options.disable_output_compression:
        output["CompressionType"] = "NONE"
    return output


def _stopping_condition(spec: JobSpec) -> dict[str, int]:
    if spec.max_wait:
        return {"MaxRuntimeInSeconds": spec.max_run, "MaxWaitTimeInSeconds": spec.max_wait}
    return {"MaxRuntimeInSeconds": spec.max_run}


def _optional_fields(spec: JobSpec, options: SageMakerOptions) -> dict[str, Any]:
    """Fields the SDK sends only when set."""
    extra: dict[str, Any] = {}
    if spec.environment:
        extra["Environment"] = dict(spec.environment)
    if spec.tags:
        extra["Tags"] = [dict(tag) for tag in spec.tags]
    if options.subnets is not None and options.security_group_ids is not None:
        extra["VpcConfig"] = {"Subnets": list(options.subnets),
                              "SecurityGroupIds": list(options.security_group_ids)}
    if options.enable_network_isolation:
        extra["EnableNetworkIsolation"] = True
    if options.encrypt_inter_container_traffic:
        extra["EnableInterContainerTrafficEncryption"] = True
    if spec.use_spot_instances:
        extra["EnableManagedSpotTraining"] = True
    if spec.checkpoint_s3_uri:
        checkpoint = {"S3Uri": spec.checkpoint_s3_uri}
        if spec.checkpoint_local_path:
            checkpoint["LocalPath"] = spec.checkpoint_local_path
        extra["CheckpointConfig"] = checkpoint
    if options.max_retry_attempts is not None:
        extra["RetryStrategy"] = {"MaximumRetryAttempts": options.max_retry_attempts}
    return extra


def build_training_request(
    spec: JobSpec, options: SageMakerOptions, ctx: RequestContext
) -> dict[str, Any]:
    """The keyword arguments of ``sagemaker_client.create_training_job(**request)``."""
    spec = spec.model_copy(update={"region": ctx.region})
    request: dict[str, Any] = {
        "AlgorithmSpecification": _algorithm_specification(spec, options, ctx),
        "OutputDataConfig": _output_config(options, ctx),
        "TrainingJobName": spec.job_name,
        "StoppingCondition": _stopping_condition(spec),
        "ResourceConfig": _resource_config(spec, options),
        "RoleArn": ctx.role_arn,
    }
    channels = build_input_config(spec, options, ctx.code_uri)
    if channels is not None:
        request["InputDataConfig"] = channels
    request["HyperParameters"] = spec.container_hyperparameters(
        submit_directory(options, ctx.code_uri))
    request.update(_optional_fields(spec, options))
    hook = build_debug_hook_config(spec, options, ctx)
    if hook is not None:
        request["DebugHookConfig"] = hook
    request["ProfilerConfig"] = build_profiler_config(options, ctx)
    return request
