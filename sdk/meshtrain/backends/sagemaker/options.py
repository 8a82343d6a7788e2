"""Options only the SageMaker target honours: the SageMaker SDK's estimator/session argument names.

`Estimator(..., instance_type="ml.p4d.24xlarge", subnets=[...])` passes every argument it does not
know itself to the SageMaker backend; this module turns them into one frozen, checked object.
An unknown name is a ConfigError (with the closest known name), never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError

MAX_KEEP_ALIVE_SECONDS = 21600  # ResourceConfig.KeepAlivePeriodInSeconds (botocore model)


@dataclass(frozen=True)
class SageMakerOptions:
    """SageMaker-only settings, named as in the SageMaker Python SDK v2."""

    boto_session: Any = None
    """A boto3.Session; default: boto3's standard chain (env, profile, instance role)."""
    default_bucket: str | None = None
    """Bucket used when `output_path` is not given (SDK `Session(default_bucket=...)`);
    default ``sagemaker-<region>-<account>``, created if missing."""
    code_location: str | None = None
    """S3 prefix for sourcedir.tar.gz (default: the output bucket)."""
    output_kms_key: str | None = None
    volume_kms_key: str | None = None
    subnets: tuple[str, ...] | None = None
    security_group_ids: tuple[str, ...] | None = None
    enable_network_isolation: bool = False
    encrypt_inter_container_traffic: bool = False
    max_retry_attempts: int | None = None
    keep_alive_period_in_seconds: int | None = None
    disable_output_compression: bool = False
    debugger_hook_config: Any = None
    """None: the SDK's default hook config (S3 output under output_path); False: none;
    a dict: sent as DebugHookConfig (S3OutputPath filled in when missing)."""
    disable_profiler: bool = False
    enable_sagemaker_metrics: bool | None = None
    """None: on for framework_version >= 1.3, as the SDK's PyTorch estimator does."""
    poll_seconds: float = 10.0
    """meshtrain: seconds between log polls while waiting (the SDK's `poll`)."""
    describe_seconds: float = 30.0
    """meshtrain: at least this many seconds between two DescribeTrainingJob calls."""


OPTION_NAMES = tuple(f.name for f in fields(SageMakerOptions))
OPTIONS = frozenset({*OPTION_NAMES, "sagemaker_session"})
"""The backend options SageMaker jobs take (meshtrain.targets reads them from here)."""


def _as_tuple(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{name} must be a list of ids such as ['subnet-0abc'], got {value!r}.")
    return tuple(value)


def _check_bools(options: dict[str, Any]) -> None:
    for name in ("enable_network_isolation", "encrypt_inter_container_traffic",
                 "disable_output_compression", "disable_profiler"):
        if not isinstance(options[name], bool):
            raise ConfigError(f"{name} must be True or False, got {options[name]!r}.")
    metrics = options["enable_sagemaker_metrics"]
    if metrics is not None and not isinstance(metrics, bool):
        raise ConfigError(f"enable_sagemaker_metrics must be True, False or None, got {metrics!r}.")


def _check_ranges(options: dict[str, Any]) -> None:
    retries = options["max_retry_attempts"]
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int)
                                or not 1 <= retries <= 30):
        raise ConfigError(f"max_retry_attempts={retries!r} must be an int from 1 to 30 "
                          "(SageMaker's RetryStrategy.MaximumRetryAttempts).")
    keep = options["keep_alive_period_in_seconds"]
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                             or not 0 <= keep <= MAX_KEEP_ALIVE_SECONDS):
        raise ConfigError(f"keep_alive_period_in_seconds={keep!r} must be an int from 0 to "
                          f"{MAX_KEEP_ALIVE_SECONDS} (6 hours).")
    for name in ("poll_seconds", "describe_seconds"):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}.")


def _check_debugger(hook: Any) -> None:
    if hook is None or hook is False or isinstance(hook, dict):
        return
    raise ConfigError("debugger_hook_config must be False (no SageMaker Debugger hook), None "
                      f"(the SDK's default) or a DebugHookConfig dict, got {hook!r}.")


def build_options(sagemaker_session: Any = None, **given: Any) -> SageMakerOptions:
    """Check the SageMaker-only arguments; `sagemaker_session` (a SageMaker SDK Session, or
    anything with `boto_session` / `default_bucket()`) is accepted for drop-in use."""
    unknown = sorted(set(given) - set(OPTION_NAMES))
    if unknown:
        known = (*OPTION_NAMES, "sagemaker_session")
        hints = "".join(did_you_mean(name, known) for name in unknown)
        raise ConfigError(f"unknown argument(s) for SageMaker jobs: {', '.join(unknown)}.{hints} "
                          f"Known: {', '.join(known)}.")
    if sagemaker_session is not None:
        given.setdefault("boto_session", getattr(sagemaker_session, "boto_session", None))
        bucket = getattr(sagemaker_session, "_default_bucket_name_override", None)
        if bucket:
            given.setdefault("default_bucket", bucket)
    options = {f.name: given.get(f.name, f.default) for f in fields(SageMakerOptions)}
    options["subnets"] = _as_tuple("subnets", options["subnets"])
    options["security_group_ids"] = _as_tuple("security_group_ids", options["security_group_ids"])
    if (options["subnets"] is None) != (options["security_group_ids"] is None):
        raise ConfigError("subnets and security_group_ids go together (SageMaker's VpcConfig "
                          "needs both): give both lists, or neither.")
    _check_bools(options)
    _check_ranges(options)
    _check_debugger(options["debugger_hook_config"])
    session = options["boto_session"]
    if session is not None and not hasattr(session, "client"):
        raise ConfigError(f"boto_session must be a boto3.Session, got {type(session).__name__}.")
    return SageMakerOptions(**options)
