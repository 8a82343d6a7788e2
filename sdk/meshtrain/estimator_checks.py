"""The Estimator's checks: everything a user can get wrong, caught before a job starts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from meshtrain.contract.degrees import resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.errors import ConfigError

CHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
ENV_KEY_PATTERN = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
LOCAL_OPTIONS = frozenset({"jobs_dir"})


def check_entry_point(entry_point: str, source_dir: str | None) -> tuple[str, str]:
    """Return (source, entry point relative to it); source is a directory or the script itself."""
    if not isinstance(entry_point, str) or not entry_point:
        raise ConfigError("entry_point must be the path of a training script, e.g. 'train.py'.")
    if isinstance(source_dir, str) and source_dir.startswith("s3://"):
        # The code is already in S3 (SageMaker jobs only, as Estimator.attach rebuilds them).
        if Path(entry_point).is_absolute() or ".." in Path(entry_point).parts:
            raise ConfigError(f"entry_point={entry_point!r} must be a path inside the "
                              f"source tarball {source_dir}, e.g. 'train.py'.")
        return source_dir, Path(entry_point).as_posix()
    if source_dir is None:
        script = Path(entry_point).resolve()
        if not script.is_file():
            raise ConfigError(f"entry_point={entry_point!r}: no such file (from {Path.cwd()}).")
        return str(script), script.name
    source = Path(source_dir).resolve()
    if not source.is_dir():
        raise ConfigError(f"source_dir={source_dir!r} is not a directory.")
    if Path(entry_point).is_absolute() or ".." in Path(entry_point).parts:
        raise ConfigError(f"entry_point={entry_point!r} must be a path inside source_dir "
                          f"({source}), e.g. 'train.py'.")
    if not (source / entry_point).is_file():
        raise ConfigError(f"entry_point={entry_point!r} is not a file in source_dir {source}.")
    return str(source), Path(entry_point).as_posix()


def check_hyperparameters(hyperparameters: Any) -> dict[str, Any]:
    if not isinstance(hyperparameters, dict):
        raise ConfigError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}.")
    for key, value in hyperparameters.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"hyperparameter names must be non-empty strings, got {key!r}.")
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ConfigError(f"hyperparameter {key!r}={value!r} is not JSON-serialisable; "
                              "use strings, numbers, bools, lists or dicts.") from None
    return dict(hyperparameters)


def local_gpu_count() -> int:
    """GPUs visible on this machine (nvidia-smi), without importing torch."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def gpus_per_host(instance_type: str) -> int:
    if instance_type.startswith("ml."):
        try:
            from meshtrain.plan.instances import gpus_per_instance
        except ImportError:  # the planner's instance table is optional here
            return 1
        return gpus_per_instance(instance_type)
    return local_gpu_count() if instance_type == "local_gpu" else 0


def check_cluster(
    distribution: Any, instance_type: Any, instance_count: Any, source: str, entry_point: str
) -> tuple[DistributionConfig, int]:
    """Validate the distribution against the cluster; return it and the world size."""
    if not isinstance(instance_type, str) or not instance_type:
        raise ConfigError("instance_type must be a string such as 'local' or 'ml.p4d.24xlarge'.")
    if isinstance(instance_count, bool) or not isinstance(instance_count, int) or (
            instance_count < 1):
        raise ConfigError(f"instance_count must be a positive int, got {instance_count!r}.")
    config = DistributionConfig.from_dict(distribution)
    if config.torch_distributed.enabled and not entry_point.endswith(".py"):
        raise ConfigError("torch_distributed runs Python programs only: entry_point must be a "
                          f"*.py file, got {entry_point!r}.")
    per_host = config.processes_per_host(gpus_per_host(instance_type))
    world = instance_count * per_host
    if config.model_parallel_enabled:
        resolve_degrees(config.smp, world, ranks_per_host=per_host,
                        world_description=f"{instance_count} hosts x {per_host} processes")
    return config, world


def check_environment(environment: Any) -> dict[str, str]:
    if not isinstance(environment, dict):
        raise ConfigError("environment must be a dict of str -> str.")
    for key, value in environment.items():
        if not isinstance(key, str) or not ENV_KEY_PATTERN.match(key):
            raise ConfigError(f"environment variable name {key!r} is invalid: use letters, "
                              "digits and '_', not starting with a digit.")
        if not isinstance(value, str):
            raise ConfigError(f"environment[{key!r}] must be a string, got {value!r}.")
    return dict(environment)


def check_runtime_limits(max_run: Any, max_wait: Any, use_spot: bool) -> None:
    if isinstance(max_run, bool) or not isinstance(max_run, int) or max_run < 1:
        raise ConfigError(f"max_run must be a positive number of seconds, got {max_run!r}.")
    if use_spot and max_wait is None:
        raise ConfigError("use_spot_instances=True needs max_wait (seconds, >= max_run).")
    if max_wait is not None and (not isinstance(max_wait, int) or max_wait < max_run):
        raise ConfigError(f"max_wait={max_wait!r} must be an int >= max_run={max_run} seconds.")


def _input_uri(channel: str, value: Any) -> tuple[str, str | None]:
    content_type = None
    if hasattr(value, "config"):  # a sagemaker.inputs.TrainingInput
        data_source = value.config["DataSource"]["S3DataSource"]
        return data_source["S3Uri"], value.config.get("ContentType")
    if isinstance(value, dict) and "uri" in value:
        return str(value["uri"]), value.get("content_type")
    if isinstance(value, str | Path):
        return str(value), content_type
    raise ConfigError(f"input channel {channel!r}: expected a path or URI string, got {value!r}.")


def check_inputs(inputs: Any) -> tuple[dict[str, str], dict[str, str]]:
    """`fit(inputs)`: one path/URI (channel 'training') or {channel: path/URI}."""
    if inputs is None:
        return {}, {}
    if not isinstance(inputs, dict):
        inputs = {"training": inputs}
    channels, content_types = {}, {}
    for channel, value in inputs.items():
        if not isinstance(channel, str) or not CHANNEL_PATTERN.match(channel):
            raise ConfigError(f"input channel name {channel!r} is invalid: 1-64 characters of "
                              "letters, digits, '.', '-' or '_'.")
        uri, content_type = _input_uri(channel, value)
        if not uri.startswith(("s3://", "file://")):
            uri = f"file://{Path(uri).resolve()}"
        channels[channel] = uri
        if content_type:
            content_types[channel] = content_type
    return channels, content_types


def check_backend_options(instance_type: str, options: dict[str, Any]) -> dict[str, Any]:
    """Options only some targets honour; an unknown name is a ConfigError, not a silent drop."""
    if instance_type.startswith("ml."):
        return dict(options)  # the SageMaker backend checks its own options
    unknown = sorted(set(options) - LOCAL_OPTIONS)
    if unknown:
        raise ConfigError(f"argument(s) {', '.join(unknown)} are not honoured by local jobs "
                          f"(instance_type={instance_type!r}). Remove them, or run on SageMaker.")
    return dict(options)


def inline_parameters(distribution: Any, config: DistributionConfig) -> Any:
    """The distribution with SMP parameters given as a JSON file path replaced by its content."""
    try:
        mp = distribution["smdistributed"]["modelparallel"]
    except (TypeError, KeyError):
        return distribution
    if not isinstance(mp, dict) or not isinstance(mp.get("parameters"), str | Path):
        return distribution
    smd = {**distribution["smdistributed"],
           "modelparallel": {**mp, "parameters": config.raw_parameters}}
    return {**distribution, "smdistributed": smd}
