"""A ModelTrainer as a meshtrain job: channels, the Estimator that checks it, the JobSpec.

The mapping is the SDK's own (``ModelTrainer._create_training_job_args``): the same channel
merging, hyperparameter encoding, job name and request parts. meshtrain's `Estimator` then
checks what it knows for every target (entry point, values, cluster and layout) and builds the
JobSpec, to which the ModelTrainer's own parts are added (`ModelTrainerSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.model_trainer import ModelTrainerSpec
from meshtrain.estimator import Estimator
from meshtrain.sagemaker.train._base import to_request
from meshtrain.sagemaker.train.configs import Channel, InputData, S3DataSource
from meshtrain.sagemaker.train.distributed import Torchrun
from meshtrain.sagemaker.train.mode import Mode
from meshtrain.targets import model_trainer_instance_type, target_kind

# A `ModelTrainer`: model_trainer.py imports this module, so the type is not named here (no
# import cycle, even for type checkers).
ModelTrainer = Any

DEFAULT_INSTANCE_COUNT = 1
DEFAULT_VOLUME_SIZE = 30
DEFAULT_MAX_RUNTIME_IN_SECONDS = 3600
DEFAULT_COMPRESSION = "GZIP"
MAX_JOB_NAME = 63


@dataclass(frozen=True)
class _ChannelConfig:
    """A channel given as its request config (what `Estimator.fit` takes as `.config`)."""

    config: dict[str, Any]


def unique_job_name(base: str, now: datetime | None = None) -> str:
    """The SDK's `_get_unique_name`: ``<base>-%Y%m%d%H%M%S``, '_' as '-', at most 63."""
    stamp = (now or datetime.now()).strftime("%Y%m%d%H%M%S")
    return f"{base.replace('_', '-')}-{stamp}"[:MAX_JOB_NAME]


def merge_channels(given: list[Any] | None, extra: list[Any] | None) -> list[Any]:
    """The constructor's channels with train()'s: a name given again is replaced in place,
    new names follow (the SDK's order)."""
    merged = {channel.channel_name: channel for channel in given or []}
    new = []
    for channel in extra or []:
        if channel.channel_name in merged:
            merged[channel.channel_name] = channel
        else:
            new.append(channel)
    return [*merged.values(), *new]


def _s3_prefix_channel(uri: str) -> dict[str, Any]:
    """The channel the SDK makes of an S3 URI (or of a local path once uploaded)."""
    return {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File"}


def estimator_input(channel: Channel | InputData) -> tuple[str, Any]:
    """(name, what `Estimator.fit(inputs)` takes for it) of one v3 channel."""
    name = channel.channel_name
    if not name:
        raise ConfigError(f"InputData needs a channel_name, got {channel!r}.")
    if isinstance(channel, Channel):
        config = to_request(channel)
        config.pop("ChannelName")
        return name, _ChannelConfig(config)
    source, content = channel.data_source, ({"ContentType": channel.content_type}
                                            if channel.content_type else {})
    if isinstance(source, str):
        if source.startswith("s3://"):
            return name, _ChannelConfig({**_s3_prefix_channel(source), **content})
        if "://" in source or not Path(source).exists():
            raise ConfigError(f"Not a valid S3 URI or local file path: {source} (channel "
                              f"{name!r}). Pass s3://bucket/prefix, or a local path without a "
                              "scheme (file:// URIs are refused, as by the SDK).")
        return name, {"uri": source, "content_type": channel.content_type}
    if source is None:
        raise ConfigError(f"InputData({name!r}) needs a data_source: an S3 URI, a local path, an "
                          "S3DataSource or a FileSystemDataSource.")
    key = "S3DataSource" if isinstance(source, S3DataSource) else type(source).__name__
    return name, _ChannelConfig({"DataSource": {key: to_request(source)}, **content})


def estimator_inputs(channels: list[Any]) -> dict[str, Any]:
    return dict(estimator_input(channel) for channel in channels)


def target_instance_type(trainer: ModelTrainer) -> str:
    return model_trainer_instance_type(trainer.compute.instance_type,
                                       trainer.training_mode == Mode.LOCAL_CONTAINER)


def on_sagemaker(trainer: ModelTrainer) -> bool:
    return target_kind(target_instance_type(trainer)).name == "sagemaker"


def build_estimator(trainer: ModelTrainer, hyperparameters: dict[str, Any]) -> Estimator:
    """meshtrain's Estimator for the trainer: every check meshtrain makes, nothing started."""
    compute, stopping, source = trainer.compute, trainer.stopping_condition, trainer.source_code
    sagemaker = on_sagemaker(trainer)
    options = dict(trainer.backend_options or {})
    if sagemaker and trainer.sagemaker_session is not None:
        options.setdefault("sagemaker_session", trainer.sagemaker_session)
    output = trainer.output_data_config
    return Estimator(
        entry_point=str(source.entry_script), source_dir=source.source_dir,
        hyperparameters=hyperparameters, instance_type=target_instance_type(trainer),
        instance_count=compute.instance_count or DEFAULT_INSTANCE_COUNT,
        distribution=trainer.distributed.distribution() if trainer.distributed else None,
        role=trainer.role, image_uri=trainer.training_image,
        output_path=output.s3_output_path if sagemaker and output else None,
        environment=dict(trainer.environment or {}),
        max_run=stopping.max_runtime_in_seconds or DEFAULT_MAX_RUNTIME_IN_SECONDS,
        max_wait=stopping.max_wait_time_in_seconds,
        use_spot_instances=bool(compute.enable_managed_spot_training),
        volume_size=compute.volume_size_in_gb or DEFAULT_VOLUME_SIZE,
        input_mode=trainer.training_input_mode or "File",
        tags=[{"Key": tag.key, "Value": tag.value} for tag in trainer.tags or []],
        metric_definitions=[{"Name": m.name, "Regex": m.regex}
                            for m in trainer._metric_definitions or []],
        **options)


def _optional_request_fields(trainer: ModelTrainer) -> dict[str, Any]:
    """The request's top-level fields a ModelTrainer sets beyond the JobSpec's (None: not
    sent; a shape whose fields are all unset or false is sent as {}, as by the SDK)."""
    networking, compute = trainer.networking, trainer.compute
    fields = {
        "VpcConfig": networking.vpc_config() if networking else None,
        "EnableNetworkIsolation": networking.enable_network_isolation if networking else None,
        "EnableInterContainerTrafficEncryption": (
            networking.enable_inter_container_traffic_encryption if networking else None),
        "EnableManagedSpotTraining": compute.enable_managed_spot_training,
        "CheckpointConfig": to_request(trainer.checkpoint_config),
        "TensorBoardOutputConfig": to_request(trainer._tensorboard_output_config),
        "RetryStrategy": to_request(trainer._retry_strategy),
        "RemoteDebugConfig": to_request(trainer._remote_debug_config),
        "InfraCheckConfig": to_request(trainer._infra_check_config),
        "SessionChainingConfig": to_request(trainer._session_chaining_config),
        "ModelPackageConfig": to_request(trainer.model_package_config),
    }
    return {key: value for key, value in fields.items() if value is not None}


def model_trainer_spec(trainer: ModelTrainer) -> ModelTrainerSpec:
    """The trainer's parts a JobSpec has no field for (its request's and its code's)."""
    distributed = trainer.distributed
    smp = distributed.smp if isinstance(distributed, Torchrun) else None
    output = trainer.output_data_config
    output_fields = {"KmsKeyId": output.kms_key_id if output else None,
                     "CompressionType": (output.compression_type if output else None)
                     or DEFAULT_COMPRESSION}
    algorithm = ({"TrainingImageConfig": to_request(trainer.training_image_config)}
                 if trainer.training_image_config else {})
    return ModelTrainerSpec(
        base_job_name=str(trainer.base_job_name),
        input_s3_key_prefix=trainer.input_s3_key_prefix,
        source_code=trainer.source_code.model_dump(),
        distributed=distributed.driver_config() if distributed else {},
        mp_parameters=smp._to_mp_hyperparameters()["mp_parameters"] if smp else None,
        request=_optional_request_fields(trainer), algorithm=algorithm,
        resources=trainer.compute.resource_config(),
        output={k: v for k, v in output_fields.items() if v},
        stopping=to_request(trainer.stopping_condition))


def build_job(trainer: ModelTrainer, channels: list[Any],
              job_name: str | None = None) -> tuple[Estimator, JobSpec]:
    """The Estimator (checks, backend) and the JobSpec a `train()` submits."""
    estimator = build_estimator(trainer, dict(trainer.hyperparameters or {}))
    spec = estimator.build_spec(estimator_inputs(channels),
                                job_name or unique_job_name(str(trainer.base_job_name)))
    return estimator, spec.model_copy(update={"model_trainer": model_trainer_spec(trainer)})
