"""The contract between the client and the hosts: the one place that defines what crosses."""

from meshtrain.contract.degrees import ResolvedDegrees, resolve_degrees
from meshtrain.contract.distribution import (
    DistributionConfig,
    SMPParameters,
    parse_smp_parameters,
)
from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.contract.hyperparameters import (
    decode_hyperparameters,
    encode_hyperparameters,
    split_hyperparameters,
    to_cmd_args,
)
from meshtrain.contract.jobspec import JobSpec, write_host_config
from meshtrain.contract.paths import OptMLPaths

__all__ = [
    "ConfigError",
    "DistributionConfig",
    "JobFailedError",
    "JobSpec",
    "OptMLPaths",
    "ResolvedDegrees",
    "SMPParameters",
    "decode_hyperparameters",
    "encode_hyperparameters",
    "parse_smp_parameters",
    "resolve_degrees",
    "split_hyperparameters",
    "to_cmd_args",
    "write_host_config",
]
