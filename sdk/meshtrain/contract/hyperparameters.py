"""Hyperparameter encoding as the SageMaker SDK sends it and the training toolkit reads it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# Removed from user hyperparameters by the toolkit (contract §3.2).
SAGEMAKER_RESERVED = frozenset({
    "sagemaker_program", "sagemaker_submit_directory", "sagemaker_enable_cloudwatch_metrics",
    "sagemaker_region", "sagemaker_container_log_level", "sagemaker_job_name",
    "default_user_module_name", "_tuning_objective_metric", "sagemaker_s3_output",
})


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
        elif key.startswith("sagemaker_"):
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
