"""SDK v2's names: `sagemaker.pytorch.PyTorch` and `sagemaker.inputs`' channel objects.

`PyTorch` is `meshtrain.Estimator` under the SDK's name. `TrainingInput`, `FileSystemInput`
and `ShuffleConfig` build the same ``config`` dict as SDK v2 (``sagemaker/inputs.py``), checked
when they are built: a value SageMaker would reject is a ConfigError at once. The SDK's own
objects are accepted by `fit()` as well.
"""

from __future__ import annotations

from typing import Any

from meshtrain.channels import (
    COMPRESSIONS,
    DISTRIBUTIONS,
    INPUT_MODES,
    RECORD_WRAPPERS,
    S3_DATA_TYPES,
    channel_from_object,
    check_file_system,
)
from meshtrain.contract.errors import ConfigError
from meshtrain.estimator import Estimator

PyTorch = Estimator
"""`sagemaker.pytorch.PyTorch`: the same class as `meshtrain.Estimator`."""

__all__ = ["FileSystemInput", "PyTorch", "ShuffleConfig", "TrainingInput"]


class ShuffleConfig:
    """`sagemaker.inputs.ShuffleConfig`: shuffle a channel's S3 objects with `seed`."""

    def __init__(self, seed: int) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"ShuffleConfig(seed) takes an int, got {seed!r}.")
        self.seed = seed


def _optional(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise ConfigError(f"TrainingInput({name}={value!r}): expected one of "
                          f"{', '.join(allowed)} or None.")


class TrainingInput:
    """`sagemaker.inputs.TrainingInput`: an S3 channel with SageMaker's per-channel options."""

    def __init__(
        self,
        s3_data: str,
        distribution: str | None = None,
        compression: str | None = None,
        content_type: str | None = None,
        record_wrapping: str | None = None,
        s3_data_type: str = "S3Prefix",
        instance_groups: list[str] | None = None,
        input_mode: str | None = None,
        attribute_names: list[str] | None = None,
        target_attribute_name: str | None = None,
        shuffle_config: ShuffleConfig | None = None,
        hub_access_config: dict[str, Any] | None = None,
        model_access_config: dict[str, Any] | None = None,
    ) -> None:
        _optional("distribution", distribution, DISTRIBUTIONS)
        _optional("compression", compression, COMPRESSIONS)
        _optional("record_wrapping", record_wrapping, RECORD_WRAPPERS)
        _optional("input_mode", input_mode, INPUT_MODES)
        _optional("s3_data_type", s3_data_type, S3_DATA_TYPES)
        source: dict[str, Any] = {"S3DataType": s3_data_type, "S3Uri": s3_data}
        self.config: dict[str, Any] = {"DataSource": {"S3DataSource": source}}
        if not (target_attribute_name or distribution):
            distribution = "FullyReplicated"  # the SDK's default
        optional = {
            "CompressionType": compression, "ContentType": content_type,
            "RecordWrapperType": record_wrapping, "InputMode": input_mode,
            "TargetAttributeName": target_attribute_name,
        }
        if distribution is not None:
            source["S3DataDistributionType"] = distribution
        if instance_groups is not None:
            source["InstanceGroupNames"] = list(instance_groups)
        if attribute_names is not None:
            source["AttributeNames"] = list(attribute_names)
        for key, value in optional.items():  # the SDK's key order
            if value is not None:
                self.config[key] = value
        if shuffle_config is not None:
            self.config["ShuffleConfig"] = {"Seed": shuffle_config.seed}
        if hub_access_config is not None:
            source["HubAccessConfig"] = hub_access_config
        if model_access_config is not None:
            source["ModelAccessConfig"] = model_access_config
        channel_from_object("TrainingInput", self)  # every combination check, now

    def __repr__(self) -> str:
        return f"TrainingInput({self.config!r})"


class FileSystemInput:
    """`sagemaker.inputs.FileSystemInput`: an EFS or FSx for Lustre channel."""

    def __init__(
        self,
        file_system_id: str,
        file_system_type: str,
        directory_path: str,
        file_system_access_mode: str = "ro",
        content_type: str | None = None,
    ) -> None:
        check_file_system("FileSystemInput", file_system_id, file_system_type, directory_path,
                          file_system_access_mode)
        self.config: dict[str, Any] = {"DataSource": {"FileSystemDataSource": {
            "FileSystemId": file_system_id,
            "FileSystemType": file_system_type,
            "DirectoryPath": directory_path,
            "FileSystemAccessMode": file_system_access_mode,
        }}}
        if content_type:
            self.config["ContentType"] = content_type

    def __repr__(self) -> str:
        return f"FileSystemInput({self.config!r})"
