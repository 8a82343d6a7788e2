"""Where a job runs: the one reader of `instance_type`.

`resolve_target("ml.p4d.24xlarge")` names the backend that runs it, the GPUs each host has and
the backend options it takes. A new backend is one :class:`TargetKind` in ``TARGET_KINDS`` plus
its own folder under ``meshtrain/backends/``; nothing else parses instance types.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError

if TYPE_CHECKING:
    from meshtrain.backends import Backend


def local_gpu_count() -> int:
    """GPUs visible on this machine (nvidia-smi), without importing torch."""
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def local_cores() -> int:
    """CPU cores this process may run on (its affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _sagemaker_gpus(instance_type: str) -> int:
    from meshtrain.plan.instances import gpus_per_instance

    return gpus_per_instance(instance_type)  # ConfigError with a did-you-mean if unknown


def _sagemaker_options() -> frozenset[str]:
    from meshtrain.backends.sagemaker.options import OPTION_NAMES

    return frozenset({*OPTION_NAMES, "sagemaker_session"})


def _kubernetes_gpus(instance_type: str) -> int:
    return _sagemaker_gpus(instance_type.removeprefix(KUBERNETES_PREFIX))


KUBERNETES_PREFIX = "k8s:"
DOCKER_OPTIONS = frozenset({"jobs_dir", "volumes", "shm_size"})
DOCKER_OPTION_CHECK = "meshtrain.backends.docker.volumes:check_options"
KUBERNETES_OPTIONS = frozenset({"namespace", "kube_context", "kubeconfig", "kind",
                                "code_in_image", "api_client"})


@dataclass(frozen=True)
class TargetKind:
    """One family of instance types and the backend that runs it."""

    name: str
    title: str
    """How messages name its jobs ("local", "SageMaker")."""
    matches: Callable[[str], bool]
    backend_class: str
    """``module:Class`` of the backend, imported only when a job is submitted."""
    gpus_per_host: Callable[[str], int]
    options: Callable[[], frozenset[str]]
    on_this_machine: bool
    """Every rank runs on this machine: bounded by its cores, its devices decide cpu_offload."""
    max_hosts: int | None = None
    example: str = ""
    hardware: Callable[[str], str] = str
    """The instance type the planner's table knows (Kubernetes drops its "k8s:" prefix)."""
    check_options: str = ""
    """``module:function`` that checks the option values (called with them as keywords; raises
    ConfigError), imported only when an Estimator is made for this kind."""

    def validate_options(self, options: dict[str, Any]) -> None:
        """Check the values of this kind's backend options (no session, no request)."""
        if self.check_options:
            module_name, function_name = self.check_options.split(":")
            getattr(importlib.import_module(module_name), function_name)(**options)


TARGET_KINDS: tuple[TargetKind, ...] = (
    # processes_per_host defaults to this machine's GPUs (CPU: 1), as the hosts count them.
    TargetKind("local", "local", lambda t: t == "local", "meshtrain.backends.local:LocalBackend",
               gpus_per_host=lambda _: local_gpu_count(), options=lambda: frozenset({"jobs_dir"}),
               on_this_machine=True, example="'local' (processes on this machine)"),
    TargetKind("local_docker", "local Docker", lambda t: t == "local_docker",
               "meshtrain.backends.docker:DockerBackend", gpus_per_host=lambda _: 0,
               options=lambda: DOCKER_OPTIONS, on_this_machine=True,
               example="'local_docker' (one container per host on this machine)",
               check_options=DOCKER_OPTION_CHECK),
    TargetKind("local_gpu", "local Docker", lambda t: t == "local_gpu",
               "meshtrain.backends.docker:DockerBackend",
               gpus_per_host=lambda _: local_gpu_count(),
               options=lambda: DOCKER_OPTIONS, on_this_machine=True, max_hosts=1,
               example="'local_gpu' (one container with this machine's GPUs)",
               check_options=DOCKER_OPTION_CHECK),
    TargetKind("sagemaker", "SageMaker", lambda t: t.startswith("ml."),
               "meshtrain.backends.sagemaker:SageMakerBackend", gpus_per_host=_sagemaker_gpus,
               options=_sagemaker_options, on_this_machine=False,
               example="an Amazon SageMaker type such as 'ml.p4d.24xlarge'",
               check_options="meshtrain.backends.sagemaker.options:build_options"),
    TargetKind("kubernetes", "Kubernetes", lambda t: t.startswith(KUBERNETES_PREFIX),
               "meshtrain.backends.kubernetes.backend:KubernetesBackend",
               gpus_per_host=_kubernetes_gpus, options=lambda: KUBERNETES_OPTIONS,
               on_this_machine=False,
               example="'k8s:' and a node type for Kubernetes, e.g. 'k8s:ml.p5.48xlarge'",
               hardware=lambda t: t.removeprefix(KUBERNETES_PREFIX)),
)
FIXED_NAMES = ("local", "local_docker", "local_gpu")
"""The instance types that are names rather than patterns (for a did-you-mean)."""


@dataclass(frozen=True)
class Target:
    """A resolved instance type: its kind, the GPUs per host, the options its backend takes."""

    kind: TargetKind
    instance_type: str
    gpus_per_host: int

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def hardware_type(self) -> str:
        """The instance type as the planner's table names it."""
        return self.kind.hardware(self.instance_type)

    @property
    def on_this_machine(self) -> bool:
        return self.kind.on_this_machine

    @property
    def options(self) -> frozenset[str]:
        return self.kind.options()

    def backend(self, **options: Any) -> Backend:
        """The backend object for this target (its module is imported now, not before)."""
        return backend_named(self.kind.name, **options)


def target_kind(instance_type: Any) -> TargetKind:
    """The kind of `instance_type` without resolving its GPUs (cheap, no subprocess)."""
    if not isinstance(instance_type, str) or not instance_type:
        raise ConfigError("instance_type must be a string such as 'local' or 'ml.p4d.24xlarge'.")
    for kind in TARGET_KINDS:
        if kind.matches(instance_type):
            return kind
    raise ConfigError(
        f"instance_type={instance_type!r} is not a known target."
        f"{did_you_mean(instance_type, FIXED_NAMES)} Use "
        + ", ".join(kind.example for kind in TARGET_KINDS) + ".")


def resolve_target(instance_type: Any) -> Target:
    """The target that runs `instance_type`; ConfigError naming the known ones otherwise."""
    kind = target_kind(instance_type)
    return Target(kind, instance_type, kind.gpus_per_host(instance_type))


def known_options() -> frozenset[str]:
    """Every backend option some target takes (a typo in none of them is a ConfigError)."""
    return frozenset().union(*(kind.options() for kind in TARGET_KINDS))


def options_text(most: int = 5) -> str:
    """Each target kind's backend options for an error message, read from the table (a new
    kind's options appear without editing any message); long lists end with "..."."""
    titles: dict[str, set[str]] = {}
    for kind in TARGET_KINDS:
        titles.setdefault(kind.title, set()).update(kind.options())
    parts = []
    for title, names in titles.items():
        shown = sorted(names)
        listed = ", ".join(shown[:most]) + (", ..." if len(shown) > most else "")
        parts.append(f"{listed} ({title})" if shown else f"none ({title})")
    return "; ".join(parts)


def backend_named(name: str, **options: Any) -> Backend:
    """The backend of the target kind called `name` (e.g. to attach to an existing job)."""
    for kind in TARGET_KINDS:
        if kind.name == name:
            module_name, class_name = kind.backend_class.split(":")
            return getattr(importlib.import_module(module_name), class_name)(**options)
    raise ValueError(f"no target kind named {name!r}")  # internal: names are literals
