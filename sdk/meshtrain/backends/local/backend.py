"""Local backend: every host is a process tree on this machine, inside the /opt/ml contract.

The job directory, its supervisor and the handle are the shared host layer's
(meshtrain.backends.hosts); this backend's supervisor starts each host as a bootstrap process.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtrain.backends.hosts.backend import HostBackend
from meshtrain.backends.hosts.job import HostTrainingJob

if TYPE_CHECKING:
    from meshtrain.targets import Target

OPTIONS = frozenset({"jobs_dir"})
"""The backend options local jobs take (meshtrain.targets reads them from here)."""


class LocalTrainingJob(HostTrainingJob):
    """Handle of a local job (attach() works from any process on this machine)."""


class LocalBackend(HostBackend):
    """Runs jobs as local processes under `jobs_dir` (default ~/.meshtrain/jobs)."""

    name = "local"
    title = "local"
    supervisor_module = "meshtrain.backends.local.supervisor"
    job_class = LocalTrainingJob
    supports_fault_tolerance = True

    def __init__(self, target: Target | None = None, jobs_dir: str | Path | None = None,
                 **_ignored: Any) -> None:
        super().__init__(target, jobs_dir)
