"""The exceptions meshtrain raises to its users."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake found before a job starts: the message names the key and the fix."""


class JobFailedError(RuntimeError):
    """A training job ended in failure; the message holds the host's failure reason."""

    def __init__(self, job_name: str, reason: str, *, status: str = "Failed") -> None:
        self.job_name = job_name
        self.reason = reason
        self.status = status
        super().__init__(f"Training job {job_name} {status.lower()}. Reason: {reason}")
