"""Input channels given as SageMaker SDK objects: `TrainingInput` and `FileSystemInput`.

A channel object (meshtrain's lookalike in `meshtrain.sagemaker`, or the SageMaker SDK's own) has a
``config`` dict: the CreateTrainingJob ``Channel`` less its ``ChannelName`` (SDK
``_Job._convert_input_to_channel``). meshtrain keeps that dict as it is (JobSpec.input_configs),
so every option reaches the request exactly as the SDK would send it, after checking it here:
a value SageMaker would reject, or a combination it refuses, is a ConfigError before any request.
"""

from __future__ import annotations

import re
from typing import Any

from meshtrain.contract.errors import ConfigError

S3_DATA_TYPES = ("S3Prefix", "ManifestFile", "AugmentedManifestFile")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
COMPRESSIONS = ("None", "Gzip")
RECORD_WRAPPERS = ("None", "RecordIO")
INPUT_MODES = ("File", "Pipe", "FastFile")
FILE_SYSTEM_TYPES = ("FSxLustre", "EFS")  # SDK inputs.FILE_SYSTEM_TYPES
FILE_SYSTEM_ACCESS_MODES = ("ro", "rw")
FILE_SYSTEM_ID = re.compile(r"^fs-[0-9a-f]{8,40}$")
CHANNEL_KEYS = ("DataSource", "ContentType", "CompressionType", "RecordWrapperType", "InputMode",
                "ShuffleConfig", "TargetAttributeName")
S3_SOURCE_KEYS = ("S3DataType", "S3Uri", "S3DataDistributionType", "AttributeNames",
                  "InstanceGroupNames", "HubAccessConfig", "ModelAccessConfig")
FS_SOURCE_KEYS = ("FileSystemId", "FileSystemType", "DirectoryPath", "FileSystemAccessMode")


def _one_of(channel: str, field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"input channel {channel!r}: {field}={value!r} is not one of "
                          f"{', '.join(allowed)} (SageMaker's CreateTrainingJob Channel).")


def _unknown(channel: str, where: str, given: dict[str, Any], known: tuple[str, ...]) -> None:
    extra = sorted(set(given) - set(known))
    if extra:
        raise ConfigError(f"input channel {channel!r}: {where} has unknown field(s) "
                          f"{', '.join(extra)}; known: {', '.join(known)}.")


def _check_s3_source(channel: str, source: Any) -> str:
    if not isinstance(source, dict) or not isinstance(source.get("S3Uri"), str):
        raise ConfigError(f"input channel {channel!r}: S3DataSource needs an 'S3Uri' string.")
    _unknown(channel, "S3DataSource", source, S3_SOURCE_KEYS)
    data_type = source.get("S3DataType", "S3Prefix")
    _one_of(channel, "s3_data_type", data_type, S3_DATA_TYPES)
    if "S3DataDistributionType" in source:
        _one_of(channel, "distribution", source["S3DataDistributionType"], DISTRIBUTIONS)
    if "InstanceGroupNames" in source:
        raise ConfigError(f"input channel {channel!r}: instance_groups name groups of a "
                          "heterogeneous cluster, which meshtrain does not start: drop "
                          "instance_groups (every host gets the channel).")
    names = source.get("AttributeNames")
    if names is not None:
        if data_type != "AugmentedManifestFile":
            raise ConfigError(f"input channel {channel!r}: attribute_names={names!r} select "
                              "fields of an augmented manifest; set s3_data_type="
                              f"'AugmentedManifestFile' (it is {data_type!r}) or drop them.")
        if not isinstance(names, list) or not names or not all(
                isinstance(n, str) and n for n in names):
            raise ConfigError(f"input channel {channel!r}: attribute_names must be a non-empty "
                              f"list of strings, got {names!r}.")
    return source["S3Uri"]


def _check_fs_source(channel: str, source: Any) -> str:
    if not isinstance(source, dict):
        raise ConfigError(f"input channel {channel!r}: FileSystemDataSource must be a dict.")
    _unknown(channel, "FileSystemDataSource", source, FS_SOURCE_KEYS)
    missing = [k for k in FS_SOURCE_KEYS if not isinstance(source.get(k), str)]
    if missing:
        raise ConfigError(f"input channel {channel!r}: FileSystemDataSource needs "
                          f"{', '.join(missing)} (strings).")
    check_file_system(channel, source["FileSystemId"], source["FileSystemType"],
                      source["DirectoryPath"], source["FileSystemAccessMode"])
    return file_system_uri(source)


def check_file_system(channel: str, file_system_id: Any, file_system_type: Any,
                      directory_path: Any, access_mode: Any) -> None:
    """A FileSystemInput's four fields, as SageMaker's API constrains them."""
    _one_of(channel, "file_system_type", file_system_type, FILE_SYSTEM_TYPES)
    _one_of(channel, "file_system_access_mode", access_mode, FILE_SYSTEM_ACCESS_MODES)
    if not isinstance(file_system_id, str) or not FILE_SYSTEM_ID.match(file_system_id):
        raise ConfigError(f"input channel {channel!r}: file_system_id={file_system_id!r} must "
                          "look like 'fs-0123456789abcdef0' (fs- then 8-40 hex digits).")
    if not isinstance(directory_path, str) or not directory_path.startswith("/") or len(
            directory_path) > 4096:
        raise ConfigError(f"input channel {channel!r}: directory_path={directory_path!r} must be "
                          "an absolute path in the file system (FSx for Lustre: starts with the "
                          "mount name, e.g. '/abcdefgh/data'; EFS: e.g. '/data').")


def file_system_uri(source: dict[str, Any]) -> str:
    """The channel's location as one string: ``efs://fs-.../path`` or ``fsxlustre://fs-.../path``."""
    return (f"{source['FileSystemType'].lower()}://{source['FileSystemId']}"
            f"{source['DirectoryPath']}")


def _check_options(channel: str, config: dict[str, Any]) -> None:
    if "CompressionType" in config:
        _one_of(channel, "compression", config["CompressionType"], COMPRESSIONS)
    if "RecordWrapperType" in config:
        _one_of(channel, "record_wrapping", config["RecordWrapperType"], RECORD_WRAPPERS)
    if "InputMode" in config:
        _one_of(channel, "input_mode", config["InputMode"], INPUT_MODES)
    if "ContentType" in config and not (isinstance(config["ContentType"], str)
                                        and 0 < len(config["ContentType"]) <= 256):
        raise ConfigError(f"input channel {channel!r}: content_type must be a string of 1-256 "
                          f"characters, got {config['ContentType']!r}.")
    shuffle = config.get("ShuffleConfig")
    if shuffle is not None and not (isinstance(shuffle, dict) and set(shuffle) == {"Seed"}
                                    and isinstance(shuffle["Seed"], int)
                                    and not isinstance(shuffle["Seed"], bool)):
        raise ConfigError(f"input channel {channel!r}: ShuffleConfig must be {{'Seed': <int>}} "
                          f"(ShuffleConfig(seed)), got {shuffle!r}.")


def channel_from_object(channel: str, value: Any) -> tuple[str, dict[str, Any]]:
    """(location URI, checked copy of the channel config) of a TrainingInput/FileSystemInput."""
    config = value.config
    if not isinstance(config, dict) or not isinstance(config.get("DataSource"), dict):
        raise ConfigError(f"input channel {channel!r}: {value!r} has no config['DataSource'] "
                          "(expected a TrainingInput or FileSystemInput).")
    _unknown(channel, "the channel", config, CHANNEL_KEYS)
    source = config["DataSource"]
    if set(source) == {"S3DataSource"}:
        uri = _check_s3_source(channel, source["S3DataSource"])
    elif set(source) == {"FileSystemDataSource"}:
        uri = _check_fs_source(channel, source["FileSystemDataSource"])
    else:
        raise ConfigError(f"input channel {channel!r}: DataSource must hold exactly one of "
                          f"S3DataSource or FileSystemDataSource, got {sorted(source)}.")
    _check_options(channel, config)
    return uri, _deep_copy(config)


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_deep_copy(v) for v in value]
    return value


def check_channel_modes(configs: dict[str, dict[str, Any]], input_mode: str) -> None:
    """Combinations SageMaker refuses, given the estimator's `input_mode` as the default mode."""
    for channel, config in configs.items():
        mode = config.get("InputMode", input_mode)
        if config.get("CompressionType") == "Gzip" and mode != "Pipe":
            raise ConfigError(f"input channel {channel!r}: compression='Gzip' works only in Pipe "
                              f"mode (SageMaker decompresses while streaming); this channel's "
                              f"mode is {mode!r}. Set input_mode='Pipe' on the TrainingInput, "
                              "or store the data uncompressed.")
        if "FileSystemDataSource" in config["DataSource"] and mode != "File":
            raise ConfigError(f"input channel {channel!r}: an EFS/FSx channel is mounted, so its "
                              f"input mode must be 'File' (it is {mode!r}): set input_mode='File' "
                              "on the estimator, or give this channel an S3 TrainingInput.")


def is_file_system(config: dict[str, Any] | None) -> bool:
    """Whether a channel config is an EFS/FSx channel."""
    return bool(config) and "FileSystemDataSource" in config["DataSource"]
