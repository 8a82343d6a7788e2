"""Backends: one small module per target behind one protocol (submit(spec) -> TrainingJob)."""

from __future__ import annotations

from typing import Protocol

from meshtrain.contract.jobspec import JobSpec
from meshtrain.errors import ConfigError
from meshtrain.job import TrainingJob

LOCAL_INSTANCE_TYPES = ("local", "local_gpu")


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


def backend_for(instance_type: str, **options) -> Backend:
    """The backend that runs `instance_type`: local processes, or Amazon SageMaker for ml.*."""
    if instance_type in LOCAL_INSTANCE_TYPES:
        from meshtrain.backends.local import LocalBackend

        return LocalBackend(**options)
    if instance_type.startswith("ml."):
        from meshtrain.backends.sagemaker import SageMakerBackend

        return SageMakerBackend(**options)
    raise ConfigError(
        f"instance_type={instance_type!r} is not a known target. Use 'local' (processes on this "
        "machine), 'local_gpu', or an Amazon SageMaker type such as 'ml.p4d.24xlarge'."
    )
