"""Backends: one folder per target behind one small protocol. Which one runs an instance type is
decided in meshtrain.targets, the only reader of instance_type; each backend is made with its
Target (or without one, to find and attach to existing jobs: meshtrain.registry)."""

from __future__ import annotations

from typing import Any, Protocol

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

    def find(self, job_name: str) -> TrainingJob | None:
        """The handle of this backend's job called `job_name`, or None if it has none; raises
        BackendUnreachable when it cannot look (no credentials, no cluster, no network)."""

    def job_names(self) -> list[str]:
        """Names of this backend's jobs (recent ones, for a did-you-mean); may raise
        BackendUnreachable."""

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Its jobs, newest first, each DescribeTrainingJob-shaped (name, status, times,
        FailureReason) for `meshtrain list`; may raise BackendUnreachable."""

    def not_found(self, job_name: str) -> str:
        """What it found, for a not-found message ("no local job x under ~/.meshtrain/jobs")."""


class BackendUnreachable(Exception):
    """A backend cannot be searched now; the message says why and how to fix it."""
