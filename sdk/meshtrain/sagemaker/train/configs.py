"""`sagemaker.train.configs`: every config class SDK v3 (3.27.0) has there, same fields.

```python
# from sagemaker.train.configs import SourceCode, Compute, InputData, StoppingCondition
from meshtrain.sagemaker.train.configs import SourceCode, Compute, InputData, StoppingCondition
```

The SDK's own classes (SourceCode, Compute, Networking, InputData, OutputDataConfig,
TensorBoardOutputConfig, CheckpointConfig, HyperPodCompute) and the request shapes it re-exports
from sagemaker-core (StoppingCondition, Channel, S3DataSource, ...) take the same arguments
with the same defaults; a value the SDK's pydantic would refuse is a `meshtrain.ConfigError`.
"""

from __future__ import annotations

from typing import Any as _Any

from pydantic import model_validator as _model_validator

from meshtrain.sagemaker.train import shapes as _shapes
from meshtrain.sagemaker.train._base import BaseConfig, to_request
from meshtrain.sagemaker.train.shapes import (
    Channel,
    DatasetSource,
    DataSource,
    FileSystemDataSource,
    HubAccessConfig,
    InfraCheckConfig,
    InstanceGroup,
    MetricDefinition,
    ModelAccessConfig,
    RemoteDebugConfig,
    RetryStrategy,
    S3DataSource,
    SessionChainingConfig,
    ShuffleConfig,
    StoppingCondition,
    Tag,
    TrainingImageConfig,
    TrainingRepositoryAuthConfig,
)

__all__ = [
    "BaseConfig",
    "Channel",
    "CheckpointConfig",
    "Compute",
    "DataSource",
    "DatasetSource",
    "FileSystemDataSource",
    "HubAccessConfig",
    "HyperPodCompute",
    "InfraCheckConfig",
    "InputData",
    "InstanceGroup",
    "MetricDefinition",
    "ModelAccessConfig",
    "Networking",
    "OutputDataConfig",
    "RemoteDebugConfig",
    "RetryStrategy",
    "S3DataSource",
    "SessionChainingConfig",
    "ShuffleConfig",
    "SourceCode",
    "StoppingCondition",
    "Tag",
    "TensorBoardOutputConfig",
    "TrainingImageConfig",
    "TrainingRepositoryAuthConfig",
]

DEFAULT_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache",
                           ".ipynb_checkpoints"]


class SourceCode(BaseConfig):
    """The code a job runs: `source_dir` (a local folder, an S3 folder ending in '/', or a
    .tar.gz) with `entry_script` (or a shell `command` and its `args`) and `requirements`
    (a file in source_dir installed before the job)."""

    source_dir: str | None = None
    requirements: str | None = None
    entry_script: str | None = None
    command: str | None = None
    args: list[str | int | float] | None = None
    ignore_patterns: list[str] | None = list(DEFAULT_IGNORE_PATTERNS)


class Compute(BaseConfig):
    """The hosts: `instance_type` x `instance_count`, `volume_size_in_gb` (default 30)."""

    instance_type: str | None = None
    instance_count: int | None = None
    volume_size_in_gb: int | None = 30
    volume_kms_key_id: str | None = None
    keep_alive_period_in_seconds: int | None = None
    instance_groups: list[InstanceGroup] | None = None
    training_plan_arn: str | None = None
    instance_placement_config: _shapes.InstancePlacementConfig | None = None
    instance_preferences: list[_shapes.InstancePreference] | None = None
    selected_instance_type: str | None = None
    selected_instance_count: int | None = None
    enable_managed_spot_training: bool | None = None

    @_model_validator(mode="after")
    def _check_preferences(self) -> Compute:
        check_instance_preferences(self)
        return self

    def resource_config(self) -> dict[str, _Any]:
        """ResourceConfig as the SDK sends it (spot training is a field of the request)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields
                  if name != "enable_managed_spot_training"}
        return to_request(_Resources(**{k: v for k, v in fields.items() if v is not None}))


class _Resources(BaseConfig):
    """sagemaker-core's ResourceConfig: Compute less spot, no defaults (for to_request)."""

    instance_type: str | None = None
    instance_count: int | None = None
    volume_size_in_gb: int | None = None
    volume_kms_key_id: str | None = None
    keep_alive_period_in_seconds: int | None = None
    instance_groups: list[InstanceGroup] | None = None
    training_plan_arn: str | None = None
    instance_placement_config: _shapes.InstancePlacementConfig | None = None
    instance_preferences: list[_shapes.InstancePreference] | None = None
    selected_instance_type: str | None = None
    selected_instance_count: int | None = None


def check_instance_preferences(compute: Compute) -> None:
    """The SDK's client-side rules for `instance_preferences` (no-op without them)."""
    preferences = compute.instance_preferences
    if not preferences:
        return
    for field in ("instance_type", "instance_groups", "instance_placement_config"):
        if getattr(compute, field) is not None:
            raise ValueError(f"Compute: instance_preferences is mutually exclusive with {field}; "
                             "specify either a single fixed cluster or instance_preferences, "
                             "not both")
    if compute.enable_managed_spot_training is True:
        raise ValueError("Compute: instance_preferences is mutually exclusive with managed spot "
                         "training (enable_managed_spot_training=True)")
    types = [p.instance_type for p in preferences]
    duplicates = sorted({t for t in types if types.count(t) > 1})
    if duplicates:
        raise ValueError(f"Compute: instance_preferences must not contain duplicate instance "
                         f"types: {duplicates}")
    counts = [p.instance_count is not None for p in preferences]
    if compute.instance_count is not None and any(counts):
        raise ValueError("Compute: the top-level instance_count and per-preference "
                         "instance_count are mutually exclusive; set one of them")
    if compute.instance_count is None and not all(counts):
        raise ValueError("Compute: set the top-level instance_count, or an instance_count on "
                         "every element of instance_preferences")
    plans = any(p.training_plan_arns for p in preferences)
    if compute.training_plan_arn is not None and plans:
        raise ValueError("Compute: the top-level training_plan_arn and per-preference "
                         "training_plan_arns are mutually exclusive")


class HyperPodCompute(BaseConfig):
    """A SageMaker HyperPod cluster (the SDK's recipe trainers; ModelTrainer takes Compute)."""

    cluster_name: str = ""
    instance_type: str | None = None
    namespace: str = "kubeflow"
    node_count: int = 1


class Networking(BaseConfig):
    """VPC, network isolation and inter-container traffic encryption."""

    security_group_ids: list[str] | None = None
    subnets: list[str] | None = None
    enable_network_isolation: bool | None = None
    enable_inter_container_traffic_encryption: bool | None = None

    def vpc_config(self) -> dict[str, _Any] | None:
        """VpcConfig as the SDK sends it (None without subnets or security groups)."""
        vpc = {"SecurityGroupIds": self.security_group_ids, "Subnets": self.subnets}
        vpc = {key: value for key, value in vpc.items() if value}
        return vpc or None


class InputData(BaseConfig):
    """A channel from an S3 URI, a local path (uploaded for SageMaker jobs, mounted locally),
    an S3DataSource, a FileSystemDataSource or a DatasetSource."""

    channel_name: str | None = None
    data_source: str | FileSystemDataSource | S3DataSource | DatasetSource | None = None
    content_type: str | None = None


class OutputDataConfig(BaseConfig):
    """Where model.tar.gz goes: `s3_output_path` (default s3://<default bucket>/<base job
    name>), `kms_key_id`, `compression_type` (default GZIP)."""

    s3_output_path: str | None = None
    kms_key_id: str | None = None
    compression_type: str | None = None


class TensorBoardOutputConfig(BaseConfig):
    """TensorBoard event files (`local_path` in the container) synced to `s3_output_path`."""

    s3_output_path: str | None = None
    local_path: str | None = "/opt/ml/output/tensorboard"


class CheckpointConfig(BaseConfig):
    """Checkpoints synced between `local_path` in the hosts and `s3_uri` (default
    s3://<default bucket>/<base job name>/<job name>/checkpoints)."""

    s3_uri: str | None = None
    local_path: str | None = "/opt/ml/checkpoints"
