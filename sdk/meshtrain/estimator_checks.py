"""The Estimator's checks: the cluster, the inputs, paths and options, caught before a job starts.

Values (hyperparameters, environment, tags, scalars) are in estimator_values.py; the code a job
ships (entry_point, source_dir, dependencies) in estimator_sources.py.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtrain.channels import channel_from_object
from meshtrain.contract._messages import did_you_mean, hosts_and_processes
from meshtrain.contract.degrees import ResolvedDegrees, resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import check_fault_tolerance_platform
from meshtrain.contract.fault_tolerance_checks import check_fault_tolerance
from meshtrain.contract.support import (
    check_build_support,
    check_cpu_offload,
    check_fp8_device,
    degenerate_layout_notes,
)
from meshtrain.estimator_values import shown, whitespace_hint
from meshtrain.targets import (
    TARGET_KINDS,
    Target,
    known_options,
    local_cores,
    local_gpu_count,
    options_text,
)

CHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
URI_SCHEMES = ("s3://", "file://", "pvc://")
"""Input URIs kept as given (pvc:// names a Kubernetes volume); anything else is a local path."""
RANKS_PER_CORE = 4
"""Local jobs: at most this many ranks per CPU core of this machine. Each rank is a Python
process holding torch (~300 MB); beyond a few per core a job only thrashes, and a typo such as
instance_count=10000 would otherwise write thousands of host folders before failing."""


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
    distribution: Any, target: Target, instance_count: Any, entry_point: str
) -> tuple[DistributionConfig, int, ResolvedDegrees | None]:
    """Validate the distribution against the cluster: (config, world size, resolved degrees)."""
    if isinstance(instance_count, bool) or not isinstance(instance_count, int) or (
            instance_count < 1):
        raise ConfigError(f"instance_count must be a positive int, got {shown(instance_count)}.")
    max_hosts = target.kind.max_hosts
    if max_hosts is not None and instance_count > max_hosts:
        raise ConfigError(f"instance_type={target.instance_type!r} runs {max_hosts} host(s): set "
                          f"instance_count={max_hosts} (got {instance_count}), or use 'local' "
                          "for several hosts on this machine.")
    config = DistributionConfig.from_dict(distribution)
    _check_processes_need_torchrun(config)
    if config.torch_distributed.enabled and not entry_point.endswith(".py"):
        raise ConfigError("torch_distributed runs Python programs only: entry_point must be a "
                          f"*.py file, got {shown(entry_point)}.")
    per_host = config.processes_per_host(target.gpus_per_host)
    if target.on_this_machine:
        _check_local_ranks(instance_count, per_host)
    world = instance_count * per_host
    degrees = None
    if config.model_parallel_enabled:
        degrees = resolve_degrees(config.smp, world, ranks_per_host=per_host,
                                  world_description=hosts_and_processes(instance_count,
                                                                        per_host))
        check_build_support(config.smp, degrees.tensor_parallel_degree)
        if target.on_this_machine:
            device_type = "cuda" if local_gpu_count() else "cpu"
            check_cpu_offload(config.smp.cpu_offload, device_type)
            check_fp8_device(config.smp.fp8, device_type)
    if config.torch_distributed.fault_tolerance is not None:
        check_fault_tolerance(config, instance_count=instance_count, processes_per_host=per_host,
                              degrees=degrees)
        check_fault_tolerance_target(target)
    return config, world, degrees


def check_fault_tolerance_target(target: Target) -> None:
    """torchft installs on Linux x86_64 only: this machine's targets, and Graviton (arm64)
    instance types (a digit then "g" in the family: c7g, m6gd), are checked here."""
    if target.on_this_machine:
        check_fault_tolerance_platform(platform.system(), platform.machine(),
                                       where="this machine")
    elif target.instance is not None and re.search(r"\dg", target.instance.family):
        check_fault_tolerance_platform("Linux", "aarch64",
                                       where=f"instance_type={target.instance_type!r} (Graviton)")


def _check_processes_need_torchrun(config: DistributionConfig) -> None:
    """processes_per_host is torchrun's count: refused without it rather than silently ignored."""
    given = config.torch_distributed.processes_per_host
    if given is not None and not config.torch_distributed.enabled:
        raise ConfigError(
            f"torch_distributed.processes_per_host={given} is set, but torch_distributed is not "
            "enabled: without torchrun the entry point runs once per host (as on SageMaker), so "
            f"the {given} processes would never start. To run {given} per host, set "
            f"distribution={{'torch_distributed': {{'enabled': True, 'processes_per_host': "
            f"{given}}}}}; for one plain process per host, remove processes_per_host.")


def layout_notes(config: DistributionConfig, degrees: ResolvedDegrees | None,
                 ranks_per_host: int) -> list[str]:
    """Warnings (said once per fit(), not refused) about a layout that runs but runs badly."""
    if degrees is None:
        return []
    notes = degenerate_layout_notes(config.smp, degrees)
    tp = degrees.tensor_parallel_degree
    if tp > 1 and ranks_per_host % tp:
        spans = (f"every tensor-parallel group of {tp} ranks spans {tp // ranks_per_host} hosts"
                 if tp % ranks_per_host == 0 else
                 f"tensor-parallel groups of {tp} consecutive ranks straddle hosts")
        notes.append(
            f"tensor_parallel_degree={tp} spans hosts: each host runs {ranks_per_host} "
            f"processes, so {spans}, and every layer's all-reduces and all-gathers cross the "
            "network between hosts instead of the links within one (usually several times "
            f"slower). Keep tensor_parallel_degree a divisor of {ranks_per_host} and scale "
            "across hosts with hybrid_shard_degree or data parallelism.")
    return notes


def check_runtime_limits(max_run: Any, max_wait: Any, use_spot: bool) -> None:
    if isinstance(max_run, bool) or not isinstance(max_run, int) or max_run < 1:
        raise ConfigError(f"max_run must be a positive number of seconds, got {shown(max_run)}.")
    if use_spot and max_wait is None:
        raise ConfigError("use_spot_instances=True needs max_wait (seconds, >= max_run).")
    if max_wait is not None and (isinstance(max_wait, bool) or not isinstance(max_wait, int)
                                 or max_wait < max_run):
        raise ConfigError(f"max_wait={shown(max_wait)} must be an int >= max_run={max_run} "
                          "seconds.")


def _input_uri(channel: str, value: Any) -> tuple[str, str | None]:
    if isinstance(value, dict) and isinstance(value.get("uri"), str | Path):
        content_type = value.get("content_type")
        if content_type is not None and not isinstance(content_type, str):
            raise ConfigError(f"input channel {channel!r}: content_type must be a string.")
        return str(value["uri"]), content_type
    if isinstance(value, str | Path):
        return str(value), None
    raise ConfigError(f"input channel {channel!r}: expected a path or URI string, got "
                      f"{shown(value)}.")


def check_channel_name(channel: Any) -> str:
    """1-64 letters, digits, '.', '-', '_' (SageMaker's pattern), not '.' or '..' (a directory)."""
    if not isinstance(channel, str) or not CHANNEL_PATTERN.fullmatch(channel) or channel in (
            ".", ".."):
        raise ConfigError(f"input channel name {shown(channel)} is invalid"
                          f"{whitespace_hint(channel)}: 1-64 characters of "
                          "letters, digits, '.', '-' or '_', and not '.' or '..' (each channel "
                          "is a directory /opt/ml/input/data/<name>). Example: 'train'.")
    return channel


def check_inputs(
    inputs: Any,
) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
    """`fit(inputs)`: one path/URI/TrainingInput (channel 'training') or {channel: ...}.

    Returns (channel -> URI, channel -> content type, channel -> SDK channel config for channels
    given as TrainingInput/FileSystemInput objects).
    """
    if inputs is None:
        return {}, {}, {}
    if not isinstance(inputs, dict):
        inputs = {"training": inputs}
    channels, content_types, upper, configs = {}, {}, {}, {}
    for channel, value in inputs.items():
        check_channel_name(channel)
        if channel.upper() in upper:  # SM_CHANNEL_<NAME> is upper-cased: they would collide
            raise ConfigError(f"input channels {upper[channel.upper()]!r} and {channel!r} both "
                              f"become SM_CHANNEL_{channel.upper()}. Rename one.")
        upper[channel.upper()] = channel
        if hasattr(value, "config"):  # meshtrain.sagemaker's or the SDK's channel objects
            channels[channel], configs[channel] = channel_from_object(channel, value)
            continue
        uri, content_type = _input_uri(channel, value)
        if not uri or any(c in uri for c in "\n\r\x00"):
            raise ConfigError(f"input channel {channel!r}: {shown(uri)} is not a usable path or "
                              "URI.")
        if not uri.startswith(URI_SCHEMES):
            uri = f"file://{Path(uri).expanduser().resolve()}"
        channels[channel] = uri
        if content_type:
            content_types[channel] = content_type
    return channels, content_types, configs


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
        raise ConfigError(f"{name}={shown(value)}: {probe} exists and is not a directory. "
                          "Choose a directory path.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={shown(value)}: {probe} is not writable by this user, so the "
                          "job could not save its results there. Choose a writable directory.")


def check_backend_options(
    target: Target, options: dict[str, Any], own_arguments: Iterable[str]
) -> dict[str, Any]:
    """Backend-specific keywords: a typo is a ConfigError with a did-you-mean, never dropped."""
    own = list(own_arguments)
    every_option = known_options()
    for name in sorted(set(options) - every_option):
        hint = did_you_mean(name, own) or did_you_mean(name, every_option)
        raise ConfigError(f"Estimator got an unexpected keyword argument {shown(name)}.{hint} "
                          f"Its arguments: {', '.join(own)}; backend options: "
                          f"{options_text()}.")
    options = _drop_sagemaker_options_locally(target, options)
    foreign = sorted(set(options) - target.options)
    if foreign:
        owners = sorted({kind.title for kind in TARGET_KINDS if set(foreign) & kind.options()})
        takes = ", ".join(sorted(target.options)) or "none"
        raise ConfigError(f"argument(s) {', '.join(foreign)} are {' / '.join(owners)} options, "
                          f"not honoured by {target.kind.title} jobs (instance_type="
                          f"{target.instance_type!r} takes: {takes}). Remove them, or choose an "
                          "instance_type they belong to.")
    target.kind.validate_options(options)  # checks values; starts no session, sends no request
    jobs_dir = options.get("jobs_dir")
    if jobs_dir is not None:
        if not isinstance(jobs_dir, str | os.PathLike) or not str(jobs_dir) or "\x00" in str(
                jobs_dir):
            raise ConfigError(f"jobs_dir must be a directory path, got {shown(jobs_dir)}.")
        check_writable_path("jobs_dir", str(jobs_dir))
    return dict(options)


def _drop_sagemaker_options_locally(target: Target, options: dict[str, Any]) -> dict[str, Any]:
    """A SageMaker notebook run with instance_type="local": its SageMaker-only arguments
    (sagemaker_session, subnets, debugger_hook_config, ...) are dropped with one note."""
    if not target.on_this_machine:
        return options
    sagemaker = next(kind for kind in TARGET_KINDS if kind.name == "sagemaker").options()
    ignored = sorted(set(options) & (sagemaker - target.options))
    if ignored:
        print(f"meshtrain: local jobs ignore the SageMaker-only argument(s) {', '.join(ignored)}.",
              file=sys.stderr)
    return {name: value for name, value in options.items() if name not in ignored}


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
