"""The exceptions meshtrain raises to its users (defined in the contract, which the hosts share)."""

from meshtrain.contract.errors import ConfigError, JobFailedError

__all__ = ["ConfigError", "JobFailedError"]
