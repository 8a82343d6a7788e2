"""Hyperparameter encoding as the SageMaker SDK sends it and the training toolkit reads it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshtrain.contract.env import SM_HP_MP_PARAMETERS
from meshtrain.contract.errors import ConfigError

if TYPE_CHECKING:
    from meshtrain.contract.distribution import DistributionConfig

# What the SDK adds for the job itself; the toolkit removes them from the user's (contract §3.2).
PROGRAM = "sagemaker_program"
SUBMIT_DIRECTORY = "sagemaker_submit_directory"
REGION = "sagemaker_region"
CONTAINER_LOG_LEVEL = "sagemaker_container_log_level"
JOB_NAME = "sagemaker_job_name"
SAGEMAKER_RESERVED = frozenset({
    PROGRAM, SUBMIT_DIRECTORY, "sagemaker_enable_cloudwatch_metrics", REGION,
    CONTAINER_LOG_LEVEL, JOB_NAME, "default_user_module_name", "_tuning_objective_metric",
    "sagemaker_s3_output",
})
FRAMEWORK_PREFIX = "sagemaker_"
"""Other keys with this prefix are framework parameters (the toolkit's additional ones)."""

# What the SDK's PyTorch estimator adds for the distribution (contract §2.3).
TORCH_DISTRIBUTED_ENABLED = "sagemaker_torch_distributed_enabled"
INSTANCE_TYPE = "sagemaker_instance_type"
DATAPARALLEL_ENABLED = "sagemaker_distributed_dataparallel_enabled"
PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
"""The toolkit's override of processes per host, also honoured by AWS's images."""
HANG_TIMEOUT = "sagemaker_meshtrain_hang_timeout"
"""meshtrain's torch_distributed.hang_timeout, a framework parameter (not a script argument)."""
MP_PARAMETERS = "mp_parameters"
"""SMP v2's parameters, a user-level hyperparameter as the SDK sends it."""


def encode_distribution(config: DistributionConfig, instance_type: str) -> dict[str, Any]:
    """The hyperparameters the SDK adds for a distribution (not yet JSON-encoded)."""
    if not config.torch_distributed.enabled:
        return {}
    extra: dict[str, Any] = {TORCH_DISTRIBUTED_ENABLED: True, INSTANCE_TYPE: instance_type}
    if config.smdistributed is not None:
        if config.model_parallel_enabled and config.raw_parameters:
            extra[MP_PARAMETERS] = config.raw_parameters
        extra[DATAPARALLEL_ENABLED] = False
    if config.torch_distributed.processes_per_host:
        extra[PROCESSES_PER_HOST] = config.torch_distributed.processes_per_host
    if config.torch_distributed.hang_timeout:
        extra[HANG_TIMEOUT] = config.torch_distributed.hang_timeout
    return extra


def decode_distribution(framework: Mapping[str, Any],
                        user: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `distribution` dict `encode_distribution` was given (from split hyperparameters)."""
    if not framework.get(TORCH_DISTRIBUTED_ENABLED):
        return None
    torch_distributed: dict[str, Any] = {"enabled": True}
    processes = framework.get(PROCESSES_PER_HOST)
    if processes:
        torch_distributed["processes_per_host"] = int(processes)
    if framework.get(HANG_TIMEOUT):
        torch_distributed["hang_timeout"] = int(framework[HANG_TIMEOUT])
    distribution: dict[str, Any] = {"torch_distributed": torch_distributed}
    if isinstance(user.get(MP_PARAMETERS), dict) and user[MP_PARAMETERS]:
        distribution["smdistributed"] = {"modelparallel": {
            "enabled": True, "parameters": dict(user[MP_PARAMETERS])}}
    return distribution


def encode_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, str]:
    """SDK v2 `_json_encode_hyperparameters`: every value becomes its JSON text."""
    return {str(key): json.dumps(value) for key, value in hyperparameters.items()}


def decode_hyperparameters(encoded: Mapping[str, str]) -> dict[str, Any]:
    """Toolkit reading of hyperparameters.json: JSON-decode each value, else keep the text."""
    decoded = {}
    for key, value in encoded.items():
        try:
            decoded[key] = json.loads(value)
        except (TypeError, ValueError):
            decoded[key] = value
    return decoded


def split_hyperparameters(
    hyperparameters: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Split decoded hyperparameters into (sagemaker reserved, framework params, user HPs)."""
    reserved, framework, user = {}, {}, {}
    for key, value in hyperparameters.items():
        if key in SAGEMAKER_RESERVED:
            reserved[key] = value
        elif key.startswith(FRAMEWORK_PREFIX):
            framework[key] = value
        else:
            user[key] = value
    return reserved, framework, user


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def to_cmd_args(hyperparameters: Mapping[str, Any]) -> list[str]:
    """Toolkit `mapping.to_cmd_args`: sorted `--key value` (`-k` for one letter), dicts k=v,..."""
    args: list[str] = []
    for key in sorted(hyperparameters):
        name = _text(key)
        args.append(f"--{name}" if len(name) > 1 else f"-{name}")
        value = hyperparameters[key]
        if isinstance(value, Mapping):
            args.append(",".join(f"{k}={v}" for k, v in sorted(value.items())))
        else:
            args.append(_text(value))
    return args


def env_value(value: Any) -> str:
    """How the toolkit writes a value into an SM_* variable: strings raw, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def env_name(prefix: str, key: str) -> str:
    """`SM_HP_<KEY>` / `SM_CHANNEL_<NAME>`: upper-cased, as the toolkit does."""
    return prefix + key.upper()


def decode_mp_parameters(environ: Mapping[str, str]) -> dict[str, Any]:
    """SMP's parameters as a host process receives them: the ``mp_parameters`` hyperparameter in
    ``SM_HP_MP_PARAMETERS`` (`env_value`'s JSON; once more JSON-encoded when it was sent as a
    string). ``{}`` when unset or empty; a ConfigError with the fix for anything else."""
    raw = environ.get(SM_HP_MP_PARAMETERS)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
        if isinstance(value, str):  # a hyperparameter JSON-encoded once more
            value = json.loads(value)
    except json.JSONDecodeError as error:
        raise ConfigError(
            f"{SM_HP_MP_PARAMETERS} is not valid JSON ({error}): {raw[:200]!r}. It should hold "
            "the SMP parameters dict, e.g. '{\"hybrid_shard_degree\": 2}'."
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{SM_HP_MP_PARAMETERS} must hold a JSON object, got {raw[:200]!r}.")
    return value
