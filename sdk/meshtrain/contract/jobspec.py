"""JobSpec: everything a backend needs to run one training job, serialisable as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from meshtrain.contract import hyperparameters as hp
from meshtrain.contract import job_environment
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.model_trainer import SETTINGS_KEY, ModelTrainerSpec, safe_serialize

DEFAULT_CONTAINER_LOG_LEVEL = 20  # logging.INFO, as the SageMaker SDK sends it


class JobSpec(BaseModel):
    """What to run, where, with which inputs. Backends turn it into hosts."""

    # protected_namespaces=(): `model_trainer` is a field, not pydantic's (pydantic < 2.10
    # warns about the "model_" prefix on every import otherwise)
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    job_name: str
    entry_point: str
    """The script's path relative to the source root (sagemaker_program)."""
    source_dir: str
    """Local directory packed into sourcedir.tar.gz (or the entry script alone, as the SDK
    packs it when no source_dir is given)."""
    dependencies: list[str] = Field(default_factory=list)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    distribution: DistributionConfig | None = None
    """The validated distribution (None: none given). A dict only at the JSON edge."""
    instance_type: str = "local"
    instance_count: int = 1
    inputs: dict[str, str] = Field(default_factory=dict)
    """Channel name -> URI (file://, a local path, or s3://)."""
    input_content_types: dict[str, str] = Field(default_factory=dict)
    input_configs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Channel name -> the SageMaker Channel (less ChannelName) of a channel given as a
    TrainingInput/FileSystemInput: every option as the SDK carries it."""
    output_path: str | None = None
    checkpoint_s3_uri: str | None = None
    checkpoint_local_path: str | None = None
    environment: dict[str, str] = Field(default_factory=dict)
    max_run: int = 24 * 60 * 60
    max_wait: int | None = None
    use_spot_instances: bool = False
    volume_size: int = 30
    input_mode: str = "File"
    image_uri: str | None = None
    framework_version: str | None = None
    """With py_version and no image_uri: SageMaker jobs use AWS's PyTorch training image."""
    py_version: str | None = None
    role: str | None = None
    tags: list[dict[str, str]] = Field(default_factory=list)
    metric_definitions: list[dict[str, str]] = Field(default_factory=list)
    container_log_level: int = DEFAULT_CONTAINER_LOG_LEVEL
    region: str | None = None
    model_trainer: ModelTrainerSpec | None = None
    """Set for a job made by SDK v3's ModelTrainer (meshtrain.sagemaker.train): its request
    parts, its code settings, and its conventions (strings raw in the hyperparameters, the
    script's arguments in the given order, code as a channel on SageMaker)."""

    @field_validator("distribution", mode="before")
    @classmethod
    def _distribution_from_json(cls, value: Any) -> Any:
        return DistributionConfig.from_dict(value) if isinstance(value, dict) else value

    @field_serializer("distribution")
    def _distribution_to_json(self, value: DistributionConfig | None) -> dict[str, Any] | None:
        return None if value is None else value.to_dict()

    def distribution_config(self) -> DistributionConfig:
        """The distribution in force (defaults when none was given)."""
        return self.distribution or DistributionConfig()

    @property
    def hosts(self) -> list[str]:
        return [f"algo-{i}" for i in range(1, self.instance_count + 1)]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.model_validate_json(text)

    def to_record_json(self) -> str:
        """spec.json, the client's record of the job: the environment's names with masked
        values (contract/job_environment.py)."""
        return self.model_copy(
            update={"environment": job_environment.masked(self.environment)}).to_json()

    def with_environment_from(self, process_env: Mapping[str, str]) -> JobSpec:
        """This spec read back from its record, its masked environment values restored from
        MESHTRAIN_JOB_ENVIRONMENT in `process_env` (ConfigError when they are not there)."""
        names = job_environment.masked_names(self.environment)
        if not names:
            return self
        values = job_environment.values_from(process_env, names)
        return self.model_copy(update={"environment": {**self.environment, **values}})

    def distribution_hyperparameters(self) -> dict[str, Any]:
        """What the SageMaker SDK's PyTorch estimator adds for the distribution (contract §2.3)."""
        return hp.encode_distribution(self.distribution_config(), self.instance_type)

    def container_hyperparameters(self, submit_directory: str) -> dict[str, str]:
        """The JSON-encoded HyperParameters map, as CreateTrainingJob (or local mode) gets it."""
        if self.model_trainer is not None:
            return {**self.request_hyperparameters(), **self.job_hyperparameters(submit_directory)}
        values: dict[str, Any] = dict(self.hyperparameters)
        values.update(self.distribution_hyperparameters())
        values.update(self._job_keys(submit_directory))
        return hp.encode_hyperparameters(values)

    def _job_keys(self, submit_directory: str) -> dict[str, Any]:
        keys: dict[str, Any] = {
            hp.PROGRAM: self.entry_point,
            hp.SUBMIT_DIRECTORY: submit_directory,
            hp.CONTAINER_LOG_LEVEL: self.container_log_level,
            hp.JOB_NAME: self.job_name,
        }
        if self.region:
            keys[hp.REGION] = self.region
        return keys

    def request_hyperparameters(self) -> dict[str, str]:
        """A ModelTrainer job's HyperParameters as SDK v3 sends them: the user's values
        (strings raw, the rest as JSON) and the SMP parameters' ``mp_parameters``."""
        values = {key: safe_serialize(value) for key, value in self.hyperparameters.items()}
        if self.model_trainer is not None and self.model_trainer.mp_parameters is not None:
            values[hp.MP_PARAMETERS] = self.model_trainer.mp_parameters
        return values

    def job_hyperparameters(self, submit_directory: str) -> dict[str, str]:
        """A ModelTrainer job's own keys, JSON-encoded as a v2 request would carry them: the
        program, the submit directory, the distribution's framework keys, the host settings.
        On SageMaker they travel in the drivers channel (JOB_FILE), elsewhere in
        hyperparameters.json beside the user's."""
        values = {key: value for key, value in self.distribution_hyperparameters().items()
                  if key != hp.MP_PARAMETERS}
        values.update(self._job_keys(submit_directory))
        if self.model_trainer is not None:
            values[SETTINGS_KEY] = self.model_trainer.host_settings()
        return hp.encode_hyperparameters(values)

    def resource_config(self, host: str, instance_type: str | None = None) -> dict[str, Any]:
        """resourceconfig.json for one host, as SageMaker writes it."""
        instance_type = instance_type or self.instance_type
        return {
            "current_host": host,
            "current_instance_type": instance_type,
            "current_group_name": "homogeneousCluster",
            "hosts": self.hosts,
            "instance_groups": [{
                "instance_group_name": "homogeneousCluster",
                "instance_type": instance_type,
                "hosts": self.hosts,
            }],
            "network_interface_name": "eth0",
        }

    def input_data_config(self) -> dict[str, dict[str, str]]:
        """inputdataconfig.json: one entry per channel."""
        config = {}
        for channel in sorted(self.inputs):
            given = self.input_configs.get(channel, {})
            source = given.get("DataSource", {}).get("S3DataSource", {})
            entry = {
                "TrainingInputMode": given.get("InputMode", self.input_mode),
                "S3DistributionType": source.get("S3DataDistributionType", "FullyReplicated"),
                "RecordWrapperType": given.get("RecordWrapperType", "None"),
            }
            content_type = given.get("ContentType", self.input_content_types.get(channel))
            if content_type:
                entry["ContentType"] = content_type
            config[channel] = entry
        return config


def write_host_config(spec: JobSpec, config_dir: Path, host: str, submit_directory: str) -> None:
    """Write the three config files of one host into `config_dir`."""
    config_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "hyperparameters.json": spec.container_hyperparameters(submit_directory),
        "resourceconfig.json": spec.resource_config(host),
        "inputdataconfig.json": spec.input_data_config(),
    }
    for name, content in files.items():
        (config_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True))
