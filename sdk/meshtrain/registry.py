"""The job registry: find a job by name on every backend (local, Docker, SageMaker, Kubernetes).

Each backend kind of meshtrain.targets is asked once (`Backend.find`); a backend that cannot be
searched now (no AWS credentials, no kubeconfig) is skipped and named in the not-found message.
Two backends with a job of that name are an error listing both. `Estimator.attach` and the
`meshtrain status|logs|stop|describe` commands all look jobs up here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshtrain.backends import Backend, BackendUnreachable
from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain.job import TrainingJob
from meshtrain.targets import TargetKind, backend_kinds, backend_named


@dataclass(frozen=True)
class FoundJob:
    """A job and the backend (and target kind) that has it."""

    job: TrainingJob
    backend: Backend
    kind: TargetKind


@dataclass
class Search:
    """What one lookup saw: the matches, the backends searched, those it could not search."""

    job_name: str
    found: list[FoundJob] = field(default_factory=list)
    searched: list[tuple[TargetKind, Backend]] = field(default_factory=list)
    unreachable: list[tuple[TargetKind, str]] = field(default_factory=list)


def lookup_backends(only: str | None = None, **options: Any) -> list[tuple[TargetKind, Backend]]:
    """One backend per kind (`only`: the kind of that name), each made with the options it
    takes and without a target (nothing is submitted)."""
    kinds = backend_kinds()
    if only is not None:
        names = [kind.name for kind in kinds]
        if only not in names:
            raise ConfigError(f"backend={only!r} is not one of {', '.join(names)}."
                              f"{did_you_mean(only, names)}")
        kinds = [kind for kind in kinds if kind.name == only]
    return [(kind, backend_named(kind.name, **options)) for kind in kinds]


def search(job_name: str, only: str | None = None, **options: Any) -> Search:
    """Ask every backend (or `only` one) for `job_name`; never raises for an unreachable one."""
    result = Search(job_name)
    for kind, backend in lookup_backends(only, **options):
        try:
            job = backend.find(job_name)
        except BackendUnreachable as why:
            result.unreachable.append((kind, str(why)))
            continue
        result.searched.append((kind, backend))
        if job is not None:
            result.found.append(FoundJob(job, backend, kind))
    return result


def find_job(job_name: str, only: str | None = None, **options: Any) -> FoundJob:
    """The one job called `job_name`; ConfigError (with where it looked, what it could not
    search and the closest names) if there is none, or a list of the matches if several."""
    if not isinstance(job_name, str) or not job_name:
        raise ConfigError(f"a job name is a non-empty string, got {job_name!r}.")
    result = search(job_name, only, **options)
    if len(result.found) == 1:
        return result.found[0]
    if result.found:
        matches = ", ".join(f"{found.kind.title} ({found.job!r})" for found in result.found)
        kinds = " or ".join(f"--backend {found.kind.name}" for found in result.found)
        raise ConfigError(f"{len(result.found)} jobs are named {job_name!r}: {matches}. Say "
                          f"which ({kinds}; Estimator.attach(..., backend=...)).")
    raise ConfigError(not_found_message(result))


def not_found_message(result: Search) -> str:
    """No such job: what each backend searched, what could not be searched, the closest name."""
    parts = list(dict.fromkeys(backend.not_found(result.job_name)  # a shared jobs_dir once
                               for _, backend in result.searched))
    text = ", and ".join(parts) if parts else f"no job named {result.job_name!r} was searched for"
    if result.unreachable:
        text += "; not searched: " + ", ".join(f"{kind.title} ({why})"
                                              for kind, why in result.unreachable)
    return text + "." + did_you_mean(result.job_name, _known_names(result))


def _known_names(result: Search) -> list[str]:
    names: list[str] = []
    for _, backend in result.searched:
        try:
            names += backend.job_names()
        except BackendUnreachable:
            continue
    return names
