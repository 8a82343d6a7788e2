"""Where a job runs: the one reader of `instance_type`.

`resolve_target("ml.p4d.24xlarge")` names the backend that runs it, the GPUs each host has, its
row of the instance table (meshtrain.instances) and the backend options it takes. Backends get
the Target and never read the string again. A new backend is one :class:`TargetKind` in
``TARGET_KINDS`` plus its own folder under ``meshtrain/backends/`` (which declares its option
names); nothing else parses instance types.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain.instances import InstanceSpec, instance_spec


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


KUBERNETES_PREFIX = "k8s:"
SAGEMAKER_PREFIX = "ml."


def _no_row(_: str) -> InstanceSpec | None:
    return None


def _sagemaker_row(instance_type: str) -> InstanceSpec:
    return instance_spec(instance_type)  # ConfigError with a did-you-mean if unknown


def _kubernetes_row(instance_type: str) -> InstanceSpec:
    node_type = instance_type.removeprefix(KUBERNETES_PREFIX)
    if not node_type.startswith(SAGEMAKER_PREFIX):
        raise ConfigError(
            f"instance_type={instance_type!r}: a Kubernetes job names the node type it runs "
            "on as an ml.* type (e.g. 'ml.p4d.24xlarge', whose node label is p4d.24xlarge).")
    return instance_spec(node_type)


def _declared(reference: str) -> Any:
    """`module:NAME` of a backend, imported only when asked for."""
    module_name, name = reference.split(":")
    return getattr(importlib.import_module(module_name), name)


def _declared_options(reference: str) -> Callable[[], frozenset[str]]:
    """The option names a backend declares at `module:NAME`, read when first asked for."""
    return lambda: frozenset(_declared(reference))


@dataclass(frozen=True)
class TargetKind:
    """One family of instance types and the backend that runs it."""

    name: str
    title: str
    """How messages name its jobs ("local", "SageMaker")."""
    matches: Callable[[str], bool]
    backend_class: str
    """``module:Class`` of the backend, imported only when a job is submitted or looked up."""
    row: Callable[[str], InstanceSpec | None]
    """The instance table's row of an instance type (None: this machine, no row)."""
    options: Callable[[], frozenset[str]]
    """The backend options this kind takes, as its backend declares them."""
    on_this_machine: bool
    """Every rank runs on this machine: bounded by its cores, its devices decide cpu_offload."""
    max_hosts: int | None = None
    example: str = ""
    check_options: str = ""
    """``module:function`` that checks the option values (called with them as keywords; raises
    ConfigError), imported only when an Estimator is made for this kind."""
    local_gpus: bool = False
    """Its hosts get this machine's GPUs (nvidia-smi counts them)."""

    def validate_options(self, options: dict[str, Any]) -> None:
        """Check the values of this kind's backend options (no session, no request)."""
        if self.check_options:
            _declared(self.check_options)(**options)


TARGET_KINDS: tuple[TargetKind, ...] = (
    # processes_per_host defaults to this machine's GPUs (CPU: 1), as the hosts count them.
    TargetKind("local", "local", lambda t: t == "local", "meshtrain.backends.local:LocalBackend",
               row=_no_row, options=_declared_options("meshtrain.backends.local.backend:OPTIONS"),
               on_this_machine=True, example="'local' (processes on this machine)",
               local_gpus=True),
    TargetKind("local_docker", "local Docker", lambda t: t == "local_docker",
               "meshtrain.backends.docker:DockerBackend", row=_no_row,
               options=_declared_options("meshtrain.backends.docker.volumes:OPTIONS"),
               on_this_machine=True,
               example="'local_docker' (one container per host on this machine)",
               check_options="meshtrain.backends.docker.volumes:check_options"),
    TargetKind("local_gpu", "local Docker", lambda t: t == "local_gpu",
               "meshtrain.backends.docker:DockerBackend", row=_no_row,
               options=_declared_options("meshtrain.backends.docker.volumes:OPTIONS"),
               on_this_machine=True,
               max_hosts=1, example="'local_gpu' (one container with this machine's GPUs)",
               check_options="meshtrain.backends.docker.volumes:check_options", local_gpus=True),
    TargetKind("sagemaker", "SageMaker", lambda t: t.startswith(SAGEMAKER_PREFIX),
               "meshtrain.backends.sagemaker:SageMakerBackend", row=_sagemaker_row,
               options=_declared_options("meshtrain.backends.sagemaker.options:OPTIONS"),
               on_this_machine=False,
               example="an Amazon SageMaker type such as 'ml.p4d.24xlarge'",
               check_options="meshtrain.backends.sagemaker.options:build_options"),
    TargetKind("kubernetes", "Kubernetes", lambda t: t.startswith(KUBERNETES_PREFIX),
               "meshtrain.backends.kubernetes.backend:KubernetesBackend", row=_kubernetes_row,
               options=_declared_options("meshtrain.backends.kubernetes.backend:OPTIONS"),
               on_this_machine=False,
               example="'k8s:' and a node type for Kubernetes, e.g. 'k8s:ml.p5.48xlarge'"),
    TargetKind("slurm", "Slurm", lambda t: t == "slurm",
               "meshtrain.backends.slurm.backend:SlurmBackend", row=_no_row,
               options=_declared_options("meshtrain.backends.slurm.backend:OPTIONS"),
               on_this_machine=False, example="'slurm' (one sbatch job on the Slurm cluster)"),
)
FIXED_NAMES = ("local", "local_docker", "local_gpu", "slurm")
"""The instance types that are names rather than patterns (for a did-you-mean)."""


@dataclass(frozen=True)
class Target:
    """A resolved instance type: its kind, GPUs per host, table row and the options it takes."""

    kind: TargetKind
    instance_type: str
    gpus_per_host: int
    instance: InstanceSpec | None = None
    """Its row of the instance table (None for this machine's targets)."""

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def hardware_type(self) -> str:
        """The instance type as the instance table names it ("k8s:" dropped; else as given)."""
        return self.instance.instance_type if self.instance else self.instance_type

    @property
    def on_this_machine(self) -> bool:
        return self.kind.on_this_machine

    @property
    def options(self) -> frozenset[str]:
        return self.kind.options()

    def backend(self, **options: Any) -> Any:
        """The `meshtrain.backends.Backend` of this target, made with it and `options` (its
        module is imported now, not before; backends import this module, not the reverse)."""
        return _declared(self.kind.backend_class)(target=self, **options)


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
    row = kind.row(instance_type)
    gpus = local_gpu_count() if kind.local_gpus else (row.num_gpus if row else 0)
    return Target(kind, instance_type, gpus, row)


def model_trainer_instance_type(instance_type: str | None, local_container: bool) -> str:
    """The target of SageMaker SDK v3's ModelTrainer `compute.instance_type`: unset is
    meshtrain's default, 'local'; `Mode.LOCAL_CONTAINER` runs on local Docker, with this
    machine's GPUs for 'local_gpu' (as the SDK's local containers get them)."""
    if local_container:
        return "local_gpu" if instance_type == "local_gpu" else "local_docker"
    return instance_type or "local"


def target_of(instance_type: str, given: Target | None) -> Target:
    """`given` when it resolved `instance_type`, else `instance_type` resolved now (a backend
    made without a target, e.g. to attach, that is then asked to validate a spec)."""
    if given is not None and given.instance_type == instance_type:
        return given
    return resolve_target(instance_type)


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


def backend_kinds() -> list[TargetKind]:
    """One kind per backend class, in the table's order (the job registry asks each once)."""
    seen: dict[str, TargetKind] = {}
    for kind in TARGET_KINDS:
        seen.setdefault(kind.backend_class, kind)
    return list(seen.values())


def backend_named(name: str, **options: Any) -> Any:
    """The backend of the target kind called `name`, without a target (to find or attach to an
    existing job); options it does not take are left out."""
    for kind in TARGET_KINDS:
        if kind.name == name:
            taken = {key: value for key, value in options.items() if key in kind.options()}
            return _declared(kind.backend_class)(**taken)
    raise ValueError(f"no target kind named {name!r}")  # internal: names are literals
