"""Backends: one folder per target behind one small protocol. Which one runs an instance type is
decided in meshtrain.targets, the only reader of instance_type."""

from __future__ import annotations

from typing import Protocol

from meshtrain.contract.jobspec import JobSpec
from meshtrain.job import TrainingJob


class Backend(Protocol):
    """What every target implements."""

    name: str

    def validate(self, spec: JobSpec) -> None:
        """Raise ConfigError for anything in `spec` this target cannot honour. Starts nothing."""

    def submit(self, spec: JobSpec) -> TrainingJob:
        """Start the job and return its handle."""

    def attach(self, job_name: str) -> TrainingJob:
        """A handle to an existing job."""

    def load_spec(self, job_name: str) -> JobSpec:
        """The JobSpec an existing job was started from."""
