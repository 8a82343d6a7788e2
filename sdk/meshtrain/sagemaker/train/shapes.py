"""The request shapes SDK v3 re-exports from ``sagemaker.core.shapes`` in its configs.

Same class names, fields, required fields and defaults as sagemaker-core 2.27.0's shapes (an
unset optional field is None where the SDK has its ``Unassigned()``: both are left out of the
request). Only the shapes a training job's configs use are here.
"""

from __future__ import annotations

from meshtrain.sagemaker.train._base import BaseConfig


class StoppingCondition(BaseConfig):
    """When SageMaker stops the job (seconds)."""

    max_runtime_in_seconds: int | None = None
    max_wait_time_in_seconds: int | None = None
    max_pending_time_in_seconds: int | None = None


class RetryStrategy(BaseConfig):
    """How often SageMaker retries a job that failed with an internal error."""

    maximum_retry_attempts: int


class ShuffleConfig(BaseConfig):
    """Shuffle a channel's S3 objects with `seed`."""

    seed: int


class HubAccessConfig(BaseConfig):
    """A SageMaker Hub content ARN a channel reads from."""

    hub_content_arn: str


class ModelAccessConfig(BaseConfig):
    """Accept a model's end-user license agreement for a channel."""

    accept_eula: bool


class S3DataSource(BaseConfig):
    """A channel's data in S3."""

    s3_data_type: str
    s3_uri: str
    s3_data_distribution_type: str | None = None
    attribute_names: list[str] | None = None
    instance_group_names: list[str] | None = None
    model_access_config: ModelAccessConfig | None = None
    hub_access_config: HubAccessConfig | None = None


class FileSystemDataSource(BaseConfig):
    """A channel's data on EFS or FSx for Lustre."""

    file_system_id: str
    file_system_access_mode: str
    file_system_type: str
    directory_path: str


class DatasetSource(BaseConfig):
    """A channel's data from a SageMaker dataset (refused by meshtrain's channel checks)."""

    dataset_arn: str


class DataSource(BaseConfig):
    """Where a channel's data comes from: one of its sources."""

    s3_data_source: S3DataSource | None = None
    file_system_data_source: FileSystemDataSource | None = None
    dataset_source: DatasetSource | None = None


class Channel(BaseConfig):
    """One input channel, as CreateTrainingJob takes it."""

    channel_name: str
    data_source: DataSource
    content_type: str | None = None
    compression_type: str | None = None
    record_wrapper_type: str | None = None
    input_mode: str | None = None
    shuffle_config: ShuffleConfig | None = None


class TrainingRepositoryAuthConfig(BaseConfig):
    """The Lambda that gives SageMaker credentials for a private registry."""

    training_repository_credentials_provider_arn: str


class TrainingImageConfig(BaseConfig):
    """Pull the training image from a private registry in your VPC."""

    training_repository_access_mode: str
    training_repository_auth_config: TrainingRepositoryAuthConfig | None = None


class Tag(BaseConfig):
    """A key/value tag of the training job."""

    key: str
    value: str


class InfraCheckConfig(BaseConfig):
    """Check the instances before the job starts."""

    enable_infra_check: bool | None = None


class RemoteDebugConfig(BaseConfig):
    """Allow SSM access into the training container."""

    enable_remote_debug: bool | None = None


class SessionChainingConfig(BaseConfig):
    """Chain session tags into the job's role session."""

    enable_session_tag_chaining: bool | None = None


class InstanceGroup(BaseConfig):
    """A group of a heterogeneous cluster (refused by meshtrain: one cluster per job)."""

    instance_type: str
    instance_count: int
    instance_group_name: str


class PlacementSpecification(BaseConfig):
    """Instances of an UltraServer placement."""

    instance_count: int
    ultra_server_id: str | None = None


class InstancePlacementConfig(BaseConfig):
    """Where SageMaker places the instances."""

    enable_multiple_jobs: bool | None = None
    placement_specifications: list[PlacementSpecification] | None = None


class InstancePreference(BaseConfig):
    """A candidate instance type (refused by meshtrain: one instance type per job)."""

    instance_type: str
    instance_count: int | None = None
    training_plan_arns: list[str] | None = None


class MetricDefinition(BaseConfig):
    """A metric SageMaker reads from the job's log with `regex`."""

    name: str
    regex: str


class ModelPackageConfig(BaseConfig):
    """The model package group a job registers its model in."""

    model_package_group_arn: str
    source_model_package_arn: str | None = None
