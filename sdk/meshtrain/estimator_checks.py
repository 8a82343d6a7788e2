"""The Estimator's checks: the cluster, the inputs, paths and options, caught before a job starts.

Values (hyperparameters, environment, tags, scalars) are in estimator_values.py; the code a job
ships (entry_point, source_dir, dependencies) in estimator_sources.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.degrees import ResolvedDegrees, resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.support import check_build_support, check_cpu_offload
from meshtrain.errors import ConfigError

CHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
LOCAL_OPTIONS = frozenset({"jobs_dir"})
LOCAL_TYPES = ("local", "local_gpu")
RANKS_PER_CORE = 4
"""Local jobs: at most this many ranks per CPU core of this machine. Each rank is a Python
process holding torch (~300 MB); beyond a few per core a job only thrashes, and a typo such as
instance_count=10000 would otherwise write thousands of host folders before failing."""


def local_gpu_count() -> int:
    """GPUs visible on this machine (nvidia-smi), without importing torch."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def local_cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def gpus_per_host(instance_type: str) -> int:
    if instance_type.startswith("ml."):
        try:
            from meshtrain.plan.instances import gpus_per_instance
        except ImportError:  # the planner's instance table is optional here
            return 1
        return gpus_per_instance(instance_type)
    return local_gpu_count() if instance_type == "local_gpu" else 0


def _check_local_ranks(instance_count: int, per_host: int) -> None:
    """Local jobs run every rank on this machine: bound them by its cores, with the arithmetic."""
    cores = local_cores()
    limit = RANKS_PER_CORE * cores
    ranks = instance_count * per_host
    if ranks > limit:
        raise ConfigError(
            f"instance_count={instance_count} x processes_per_host={per_host} = {ranks} ranks, "
            f"but a local job runs them all on this machine's {cores} CPU cores: at most "
            f"{RANKS_PER_CORE} ranks per core ({limit}). Use fewer hosts or processes, or an "
            "ml.* instance_type.")


def check_cluster(
    distribution: Any, instance_type: Any, instance_count: Any, entry_point: str
) -> tuple[DistributionConfig, int, ResolvedDegrees | None]:
    """Validate the distribution against the cluster: (config, world size, resolved degrees)."""
    if not isinstance(instance_type, str) or not instance_type:
        raise ConfigError("instance_type must be a string such as 'local' or 'ml.p4d.24xlarge'.")
    if instance_type not in LOCAL_TYPES and not instance_type.startswith("ml."):
        raise ConfigError(
            f"instance_type={instance_type!r} is not a known target."
            f"{did_you_mean(instance_type, LOCAL_TYPES)} Use 'local' (processes on this "
            "machine), 'local_gpu', or an Amazon SageMaker type such as 'ml.p4d.24xlarge'.")
    if isinstance(instance_count, bool) or not isinstance(instance_count, int) or (
            instance_count < 1):
        raise ConfigError(f"instance_count must be a positive int, got {instance_count!r}.")
    config = DistributionConfig.from_dict(distribution)
    if config.torch_distributed.enabled and not entry_point.endswith(".py"):
        raise ConfigError("torch_distributed runs Python programs only: entry_point must be a "
                          f"*.py file, got {entry_point!r}.")
    gpus = gpus_per_host(instance_type)
    per_host = config.processes_per_host(gpus)
    if instance_type in LOCAL_TYPES:
        _check_local_ranks(instance_count, per_host)
    world = instance_count * per_host
    degrees = None
    if config.model_parallel_enabled:
        degrees = resolve_degrees(config.smp, world, ranks_per_host=per_host,
                                  world_description=f"{instance_count} hosts x {per_host} "
                                                    "processes")
        check_build_support(config.smp, degrees.tensor_parallel_degree)
        if instance_type in LOCAL_TYPES:
            check_cpu_offload(config.smp.cpu_offload, "cuda" if local_gpu_count() else "cpu")
    return config, world, degrees


def check_runtime_limits(max_run: Any, max_wait: Any, use_spot: bool) -> None:
    if isinstance(max_run, bool) or not isinstance(max_run, int) or max_run < 1:
        raise ConfigError(f"max_run must be a positive number of seconds, got {max_run!r}.")
    if use_spot and max_wait is None:
        raise ConfigError("use_spot_instances=True needs max_wait (seconds, >= max_run).")
    if max_wait is not None and (isinstance(max_wait, bool) or not isinstance(max_wait, int)
                                 or max_wait < max_run):
        raise ConfigError(f"max_wait={max_wait!r} must be an int >= max_run={max_run} seconds.")


def _input_uri(channel: str, value: Any) -> tuple[str, str | None]:
    if hasattr(value, "config"):  # a sagemaker.inputs.TrainingInput
        try:
            data_source = value.config["DataSource"]["S3DataSource"]
            return str(data_source["S3Uri"]), value.config.get("ContentType")
        except (TypeError, KeyError):
            raise ConfigError(f"input channel {channel!r}: {value!r} has no "
                              "config['DataSource']['S3DataSource']['S3Uri'].") from None
    if isinstance(value, dict) and isinstance(value.get("uri"), str | Path):
        content_type = value.get("content_type")
        if content_type is not None and not isinstance(content_type, str):
            raise ConfigError(f"input channel {channel!r}: content_type must be a string.")
        return str(value["uri"]), content_type
    if isinstance(value, str | Path):
        return str(value), None
    raise ConfigError(f"input channel {channel!r}: expected a path or URI string, got {value!r}.")


def check_channel_name(channel: Any) -> str:
    """1-64 letters, digits, '.', '-', '_' (SageMaker's pattern), not '.' or '..' (a directory)."""
    if not isinstance(channel, str) or not CHANNEL_PATTERN.match(channel) or channel in (
            ".", ".."):
        raise ConfigError(f"input channel name {channel!r} is invalid: 1-64 characters of "
                          "letters, digits, '.', '-' or '_', and not '.' or '..' (each channel "
                          "is a directory /opt/ml/input/data/<name>). Example: 'train'.")
    return channel


def check_inputs(inputs: Any) -> tuple[dict[str, str], dict[str, str]]:
    """`fit(inputs)`: one path/URI (channel 'training') or {channel: path/URI}."""
    if inputs is None:
        return {}, {}
    if not isinstance(inputs, dict):
        inputs = {"training": inputs}
    channels, content_types, upper = {}, {}, {}
    for channel, value in inputs.items():
        check_channel_name(channel)
        if channel.upper() in upper:  # SM_CHANNEL_<NAME> is upper-cased: they would collide
            raise ConfigError(f"input channels {upper[channel.upper()]!r} and {channel!r} both "
                              f"become SM_CHANNEL_{channel.upper()}. Rename one.")
        upper[channel.upper()] = channel
        uri, content_type = _input_uri(channel, value)
        if not uri or any(c in uri for c in "\n\r\x00"):
            raise ConfigError(f"input channel {channel!r}: {uri!r} is not a usable path or URI.")
        if not uri.startswith(("s3://", "file://")):
            uri = f"file://{Path(uri).expanduser().resolve()}"
        channels[channel] = uri
        if content_type:
            content_types[channel] = content_type
    return channels, content_types


def check_writable_path(name: str, value: str | None) -> None:
    """A local output/checkpoint path: a directory (or creatable one) this user may write to.

    Nothing is created: the nearest existing ancestor must be a writable directory.
    """
    if value is None or value.startswith("s3://"):
        return
    path = Path(value.removeprefix("file://")).expanduser()
    if not path.is_absolute() and name == "checkpoint_local_path":
        return  # a path inside the host (SageMaker's default /opt/ml/checkpoints), not here
    probe = path.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"{name}={value!r}: {probe} exists and is not a directory. "
                          "Choose a directory path.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={value!r}: {probe} is not writable by this user, so the "
                          "job could not save its results there. Choose a writable directory.")


def check_backend_options(
    instance_type: str, options: dict[str, Any], own_arguments: Iterable[str]
) -> dict[str, Any]:
    """Backend-specific keywords: a typo is a ConfigError with a did-you-mean, never dropped."""
    from meshtrain.backends.sagemaker_options import OPTION_NAMES, build_options

    sagemaker_only = {*OPTION_NAMES, "sagemaker_session"}
    own = list(own_arguments)
    for name in sorted(set(options) - LOCAL_OPTIONS - sagemaker_only):
        hint = did_you_mean(name, own) or did_you_mean(name, [*LOCAL_OPTIONS, *sagemaker_only])
        raise ConfigError(f"Estimator got an unexpected keyword argument {name!r}.{hint} "
                          f"Its arguments: {', '.join(own)}; backend options: jobs_dir (local) "
                          "and the SageMaker SDK's session options (ml.* types).")
    if isinstance(instance_type, str) and instance_type.startswith("ml."):
        if "jobs_dir" in options:
            raise ConfigError("jobs_dir is where local jobs live; it means nothing for "
                              f"instance_type={instance_type!r}. Remove it.")
        build_options(**options)  # checks values; starts no session and sends no request
        return dict(options)
    remote = sorted(set(options) & sagemaker_only)
    if remote:
        raise ConfigError(f"argument(s) {', '.join(remote)} are SageMaker options, not honoured "
                          f"by local jobs (instance_type={instance_type!r}). Remove them, or "
                          "run on SageMaker (an ml.* instance_type).")
    jobs_dir = options.get("jobs_dir")
    if jobs_dir is not None:
        if not isinstance(jobs_dir, str | os.PathLike) or not str(jobs_dir) or "\x00" in str(
                jobs_dir):
            raise ConfigError(f"jobs_dir must be a directory path, got {jobs_dir!r}.")
        check_writable_path("jobs_dir", str(jobs_dir))
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
