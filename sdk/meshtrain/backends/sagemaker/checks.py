"""Local checks for what CreateTrainingJob would reject later, run before any AWS request.

Limits are those of the SageMaker API model (botocore 1.43, contract §5.1); messages name the
argument, the limit and the fix.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from meshtrain.backends.s3_uri import BUCKET, parse_s3_uri
from meshtrain.backends.sagemaker.images import check_framework_versions, training_image_uri
from meshtrain.backends.sagemaker.options import SageMakerOptions
from meshtrain.backends.sagemaker.request import code_uri_for, submit_directory
from meshtrain.channels import is_file_system
from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.degrees import resolve_degrees
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.model_trainer import CODE_CHANNEL, DRIVERS_CHANNEL
from meshtrain.contract.support import (
    check_fault_tolerance_supported,
    check_restarts_supported,
    check_stop_grace_supported,
)
from meshtrain.naming import check_job_name

if TYPE_CHECKING:
    from meshtrain.targets import Target

ROLE_ARN = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
ROLE_NAME = re.compile(r"^[\w+=,.@-]{1,64}$")
REGION = re.compile(r"^[a-z]{2,5}(-[a-z]+)+-\d+$")
MAX_HYPERPARAMETERS, MAX_HP_KEY, MAX_HP_VALUE = 100, 256, 2500
MAX_ENV, MAX_ENV_KEY, MAX_ENV_VALUE = 100, 512, 512
MAX_TAGS, MAX_METRICS, MAX_CHANNELS = 50, 40, 20
MAX_RUN_SECONDS = 28 * 24 * 3600
SAGEMAKER_STOP_GRACE_SECONDS = 120  # StopTrainingJob: SIGTERM, then SIGKILL 120 s later
IMAGE_URI_ENV = "MESHTRAIN_IMAGE_URI"
INPUT_MODES = ("File", "Pipe", "FastFile")
PLACEHOLDER_ACCOUNT = "0" * 12  # an account id always has 12 digits: lengths stay exact
MODEL_TRAINER_CHANNELS = (CODE_CHANNEL, DRIVERS_CHANNEL)


def check_region(region: str | None) -> str:
    """A region is configured (boto3 chain or boto_session) and looks like one."""
    if not region:
        raise ConfigError("No AWS region is configured. Set AWS_DEFAULT_REGION (or `region` in "
                          "~/.aws/config), or pass boto_session=boto3.Session(region_name=...).")
    if not REGION.match(region):
        raise ConfigError(f"AWS region {region!r} does not look like a region, e.g. 'us-west-2'.")
    return region


def check_role(role: Any) -> str:
    """An IAM role ARN of the API's shape, or a bare role name (expanded through IAM later)."""
    if role is None:
        raise ConfigError("role is required for SageMaker jobs: the IAM role SageMaker assumes, "
                          "e.g. role='arn:aws:iam::111122223333:role/SageMakerRole'.")
    if isinstance(role, str) and (ROLE_ARN.match(role) or (
            ROLE_NAME.match(role) and not role.startswith("arn:"))):
        if len(role) > 2048:
            raise ConfigError(f"role is {len(role)} characters long; SageMaker allows 2048.")
        return role
    raise ConfigError(f"role={role!r} is neither an IAM role ARN "
                      "('arn:aws:iam::<12-digit account>:role/<name>') nor a role name.")


def check_instances(spec: JobSpec, target: Target) -> int:
    """The instance type is a known ml.* type; processes fit its GPUs; degrees fit
    instance_count x processes. Returns GPUs."""
    if target.instance is None:
        raise ConfigError(f"instance_type={spec.instance_type!r} is not a SageMaker type: use "
                          "an ml.* type such as 'ml.p4d.24xlarge'.")
    gpus = target.gpus_per_host
    config = spec.distribution_config()
    per_host = config.processes_per_host(gpus)
    if gpus and per_host > gpus:
        raise ConfigError(
            f"processes_per_host={per_host} exceeds the {gpus} GPUs of {spec.instance_type}: "
            f"each process needs a GPU of its own on SageMaker. Use processes_per_host={gpus} "
            "or fewer (or leave it out: one process per GPU), or an instance type with more "
            "GPUs.")
    if config.model_parallel_enabled:
        resolve_degrees(config.smp, spec.instance_count * per_host, ranks_per_host=per_host,
                        world_description=f"{spec.instance_count} x {spec.instance_type} with "
                                          f"{per_host} processes each")
    return gpus


def check_stopping(spec: JobSpec) -> None:
    """StoppingCondition: max_run within 28 days; max_wait >= max_run, and only with spot."""
    if spec.max_run > MAX_RUN_SECONDS:
        raise ConfigError(f"max_run={spec.max_run} s exceeds SageMaker's {MAX_RUN_SECONDS} s "
                          "(28 days).")
    if spec.max_wait is not None and not spec.use_spot_instances:
        raise ConfigError("max_wait applies to managed spot training only: set "
                          "use_spot_instances=True, or drop max_wait.")
    if spec.use_spot_instances and (spec.max_wait is None or spec.max_wait < spec.max_run):
        raise ConfigError(f"use_spot_instances=True needs max_wait >= max_run: max_wait="
                          f"{spec.max_wait} < max_run={spec.max_run}. Use max_wait="
                          f"{spec.max_run} or more (seconds of run time plus spot waiting).")


def check_hyperparameters(encoded: dict[str, str]) -> None:
    """SageMaker counts every entry, the sagemaker_* ones meshtrain adds included."""
    if len(encoded) > MAX_HYPERPARAMETERS:
        added = sum(key.startswith((hp.FRAMEWORK_PREFIX, hp.MP_PARAMETERS)) for key in encoded)
        raise ConfigError(f"{len(encoded)} hyperparameters ({len(encoded) - added} yours + "
                          f"{added} sagemaker_* entries) exceed SageMaker's {MAX_HYPERPARAMETERS}. "
                          "Group values into a dict or a config file in source_dir.")
    for key, value in encoded.items():
        if len(key) > MAX_HP_KEY:
            raise ConfigError(f"hyperparameter name {key[:40]!r}... has {len(key)} characters; "
                              f"SageMaker allows {MAX_HP_KEY}.")
        if len(value) > MAX_HP_VALUE:
            raise ConfigError(f"hyperparameter {key!r} is {len(value)} characters once "
                              f"JSON-encoded; SageMaker allows {MAX_HP_VALUE}. Put large values "
                              "in a file in source_dir and pass its name.")


def check_environment(environment: dict[str, str]) -> None:
    """Environment: at most 100 entries, names and values up to 512 characters."""
    if len(environment) > MAX_ENV:
        raise ConfigError(f"{len(environment)} environment variables exceed SageMaker's {MAX_ENV}.")
    for key, value in environment.items():
        if len(key) > MAX_ENV_KEY or len(value) > MAX_ENV_VALUE:
            raise ConfigError(f"environment[{key[:40]!r}]: SageMaker allows names up to "
                              f"{MAX_ENV_KEY} and values up to {MAX_ENV_VALUE} characters.")


def check_tags(tags: list[Any]) -> None:
    """Tags: at most 50 {'Key', 'Value'} dicts within SageMaker's lengths."""
    if len(tags) > MAX_TAGS:
        raise ConfigError(f"{len(tags)} tags exceed SageMaker's {MAX_TAGS}.")
    for tag in tags:
        ok = isinstance(tag, dict) and set(tag) == {"Key", "Value"} and all(
            isinstance(v, str) for v in tag.values())
        if not ok or not 1 <= len(tag["Key"]) <= 128 or len(tag["Value"]) > 256:
            raise ConfigError(f"tag {tag!r} must be {{'Key': <1-128 chars>, 'Value': <0-256 "
                              "chars>}, e.g. {'Key': 'team', 'Value': 'nlp'}.")


def check_metric_definitions(definitions: list[Any]) -> None:
    """MetricDefinitions: at most 40 {'Name', 'Regex'} dicts whose regexes compile."""
    if len(definitions) > MAX_METRICS:
        raise ConfigError(f"{len(definitions)} metric definitions exceed SageMaker's "
                          f"{MAX_METRICS}.")
    for item in definitions:
        ok = isinstance(item, dict) and set(item) == {"Name", "Regex"} and all(
            isinstance(v, str) for v in item.values())
        if not ok or not 1 <= len(item["Name"]) <= 255 or not 1 <= len(item["Regex"]) <= 500:
            raise ConfigError(f"metric definition {item!r} must be {{'Name': <1-255 chars>, "
                              "'Regex': <1-500 chars>}; meshtrain_runtime's log_metric lines "
                              "are matched by meshtrain.backends.sagemaker.metrics."
                              "metric_definitions('name', ...).")
        try:
            re.compile(item["Regex"])
        except re.error as error:
            raise ConfigError(f"metric {item['Name']!r}: Regex is not valid ({error}).") from None


def _check_channels(spec: JobSpec, options: SageMakerOptions) -> None:
    """Every channel is an S3 URI or a file system SageMaker reaches (a ModelTrainer's local
    channels are uploaded, and its own channels' names are taken)."""
    own = MODEL_TRAINER_CHANNELS if spec.model_trainer is not None else ()
    if len(spec.inputs) + len(own) > MAX_CHANNELS:
        raise ConfigError(f"{len(spec.inputs)} input channels (+ {len(own)} for the code and "
                          f"drivers) exceed SageMaker's {MAX_CHANNELS}.")
    for channel, uri in spec.inputs.items():
        if channel in own:
            raise ConfigError(f"input channel {channel!r}: a ModelTrainer job's own channels "
                              f"are {' and '.join(own)} (its code and drivers). Rename yours.")
        if is_file_system(spec.input_configs.get(channel)):
            check_file_system_network(channel, options, spec)
        elif not (own and uri.startswith("file://") and channel not in spec.input_configs):
            parse_s3_uri(uri, f"input channel {channel!r}")


def check_locations(spec: JobSpec, options: SageMakerOptions) -> None:
    """Every data location is an S3 URI SageMaker can use."""
    _check_channels(spec, options)
    if options.enable_network_isolation and "code" in spec.inputs:
        raise ConfigError("with enable_network_isolation=True the code travels in an input "
                          "channel named 'code': rename your 'code' channel.")
    for what in ("output_path", "checkpoint_s3_uri"):
        if getattr(spec, what) is not None:
            parse_s3_uri(getattr(spec, what), what)
    if options.code_location is not None:
        parse_s3_uri(options.code_location, "code_location")
    if options.default_bucket is not None and not BUCKET.match(options.default_bucket):
        raise ConfigError(f"default_bucket={options.default_bucket!r} is not a valid S3 bucket "
                          "name.")
    local = spec.checkpoint_local_path
    if local is not None and not local.startswith("/"):
        raise ConfigError(f"checkpoint_local_path={local!r} must be an absolute path in the "
                          "container, e.g. '/opt/ml/checkpoints'.")
    check_source_location(spec)


def check_file_system_network(channel: str, options: SageMakerOptions,
                              spec: JobSpec | None = None) -> None:
    """EFS and FSx are reached inside a VPC: the job needs subnets and security groups."""
    trainer = spec.model_trainer if spec is not None else None
    if options.subnets is None and not (trainer and "VpcConfig" in trainer.request):
        raise ConfigError(f"input channel {channel!r} is an EFS/FSx file system, which SageMaker "
                          "mounts inside your VPC: pass subnets=[...] and security_group_ids=[...] "
                          "that reach it (the file system's subnet and a group allowing its port).")


def check_source_location(spec: JobSpec) -> None:
    """An S3 source_dir is a tar.gz that nothing more can be added to."""
    if spec.source_dir.startswith("s3://"):
        parse_s3_uri(spec.source_dir, "source_dir")
        if not spec.source_dir.endswith(".tar.gz"):
            raise ConfigError(f"source_dir={spec.source_dir!r}: an S3 source_dir must name a "
                              "tar.gz file (as the SageMaker SDK requires).")
        if spec.dependencies:
            raise ConfigError("dependencies cannot be added to an S3 source_dir tarball: pack "
                              "them into it, or use a local source_dir.")


def check_resources(spec: JobSpec, target: Target, region: str | None = None) -> None:
    """Input mode, volume size and the image URI."""
    if spec.input_mode not in INPUT_MODES:
        raise ConfigError(f"input_mode={spec.input_mode!r} is not one of {', '.join(INPUT_MODES)}.")
    if spec.volume_size < 0:
        raise ConfigError(f"volume_size={spec.volume_size} GB must be >= 0.")
    image = resolve_image_uri(spec, target, region or spec.region)
    if not 1 <= len(image) <= 255:
        raise ConfigError(f"image_uri is {len(image)} characters; SageMaker allows 1-255.")


def resolve_image_uri(spec: JobSpec, target: Target, region: str | None) -> str:
    """The training image: `image_uri`; else, with framework_version/py_version, AWS's PyTorch
    (or SMP v2) training image for the region, as the SDK picks it; else $MESHTRAIN_IMAGE_URI
    (meshtrain's image from containers/, pushed to the user's own repository). None of them
    is a ConfigError."""
    if spec.image_uri:
        return spec.image_uri
    if spec.framework_version is not None or spec.py_version is not None:
        if target.instance is None:
            raise ConfigError(f"instance_type={spec.instance_type!r} has no AWS image.")
        check_framework_versions(spec.framework_version, spec.py_version, target.instance,
                                 spec.distribution)
        return training_image_uri(str(region), str(spec.framework_version),
                                  str(spec.py_version), target.instance, spec.distribution)
    image = os.environ.get(IMAGE_URI_ENV)
    if not image:
        raise ConfigError(
            "image_uri is required for SageMaker jobs: pass the URI of a training image (an AWS "
            "PyTorch training image, or meshtrain's image built from containers/Dockerfile and "
            f"pushed to your repository), or set {IMAGE_URI_ENV} to it once."
        )
    return image


def check_training_job(spec: JobSpec, target: Target, options: SageMakerOptions,
                       region: str | None) -> None:
    """Everything SageMaker would reject, checked locally; raises ConfigError. No AWS calls."""
    check_job_name(spec.job_name)
    check_region(region)
    check_role(spec.role)
    check_instances(spec, target)
    check_stopping(spec)
    check_restarts_supported(spec.distribution_config().torch_distributed.max_restarts,
                             "SageMaker")
    check_stop_grace_supported(spec.distribution_config().torch_distributed.stop_grace_seconds,
                               "SageMaker", SAGEMAKER_STOP_GRACE_SECONDS)
    fault_tolerance = spec.distribution_config().torch_distributed.fault_tolerance
    check_fault_tolerance_supported(
        fault_tolerance.replica_groups if fault_tolerance else None, "SageMaker",
        "a SageMaker training job restarts or fails as a whole (no API restarts some of its "
        "instances), and meshtrain cannot start torchft's lighthouse beside it")
    check_resources(spec, target, region)
    check_locations(spec, options)
    check_environment(spec.environment)
    check_tags(spec.tags)
    check_metric_definitions(spec.metric_definitions)
    if spec.model_trainer is not None:  # what reaches SageMaker: the user's and SMP's
        check_hyperparameters(spec.request_hyperparameters())
        return
    bucket = options.default_bucket or f"sagemaker-{region}-{PLACEHOLDER_ACCOUNT}"
    submit = submit_directory(options, code_uri_for(spec, options, bucket))
    check_hyperparameters(spec.model_copy(update={"region": region})
                          .container_hyperparameters(submit))
