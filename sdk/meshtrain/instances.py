"""The instance table: `ml.*` instance types, their GPUs, EFA, GPU memory and nominal speeds.

The one place besides meshtrain.targets that reads an instance type string: targets.py resolves
a job's instance type to a Target carrying its row (backends read the row, never the string);
the planner reads GPU memory and the nominal speeds it ranks layouts with.

Sources: GPU counts and instance network bandwidth from the AWS EC2 accelerated-computing
instance pages; the GPUs themselves (meshtrain.contract.accelerators, shared with the runtime's
MFU): GPU memory as the driver reports it (``nvidia-smi --query-gpu=memory.total``,
MiB / 1024: an "80 GB" H100 reports 81559 MiB = 79.6 GiB); peak dense bf16/fp16 tensor-core
TFLOP/s and per-GPU NVLink/PCIe bandwidth (one direction) from NVIDIA's data sheets. Speeds
only rank layouts against each other; they are not a promise of step time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshtrain.contract import accelerators as gpus
from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.accelerators import GPUSpec
from meshtrain.contract.errors import ConfigError


@dataclass(frozen=True)
class InstanceSpec:
    """One `ml.*` instance type."""

    instance_type: str
    num_gpus: int
    gpu: GPUSpec | None
    network_gbit_per_s: float
    efa_interfaces: int = 0
    """Elastic Fabric Adapter interfaces (0: no EFA), from the AWS EC2 user guide's table of
    EFA-capable types; a Kubernetes pod asks for them as ``vpc.amazonaws.com/efa``."""

    @property
    def efa(self) -> bool:
        """Whether hosts of this type talk over EFA (NCCL's fast path between hosts)."""
        return self.efa_interfaces > 0

    @property
    def node_label(self) -> str:
        """The type as EKS node labels name it, without SageMaker's "ml." prefix."""
        return self.instance_type.removeprefix("ml.")

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu.memory_gib if self.gpu else 0.0

    @property
    def family(self) -> str:
        """The family of the type ("p4d" of ml.p4d.24xlarge; "" for "local")."""
        parts = self.instance_type.split(".")
        return parts[1] if len(parts) == 3 else ""

    @property
    def processor(self) -> str:
        """"gpu" for the G and P families (AWS's images come per processor), else "cpu"."""
        return "gpu" if self.family[:1] in ("g", "p") else "cpu"

    @property
    def hardware(self) -> str:
        """The hardware name: its GPU model, or "CPU"."""
        return self.gpu.name if self.gpu else "CPU"



# (gpu, {size: (gpus, network Gbit/s)}) per family; "up to" network figures use the burst value.
_FAMILIES: dict[str, tuple[GPUSpec, dict[str, tuple[int, float]]]] = {
    "p3": (gpus.V100_16, {"8xlarge": (4, 10), "16xlarge": (8, 25)}),
    "p3dn": (gpus.V100_32, {"24xlarge": (8, 100)}),
    "p4d": (gpus.A100_40, {"24xlarge": (8, 400)}),
    "p4de": (gpus.A100_80, {"24xlarge": (8, 400)}),
    "p5": (gpus.H100, {"48xlarge": (8, 3200)}),
    "p5e": (gpus.H200, {"48xlarge": (8, 3200)}),
    "p5en": (gpus.H200, {"48xlarge": (8, 3200)}),
    "p6-b200": (gpus.B200, {"48xlarge": (8, 3200)}),
    "g4dn": (gpus.T4, {"xlarge": (1, 25), "2xlarge": (1, 25), "4xlarge": (1, 25),
                   "8xlarge": (1, 50), "16xlarge": (1, 50), "12xlarge": (4, 50)}),
    "g5": (gpus.A10G, {"xlarge": (1, 10), "2xlarge": (1, 10), "4xlarge": (1, 25),
                       "8xlarge": (1, 25),
                   "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50),
                   "48xlarge": (8, 100)}),
    "g6": (gpus.L4, {"xlarge": (1, 10), "2xlarge": (1, 10), "4xlarge": (1, 25), "8xlarge": (1, 25),
                 "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50),
                 "48xlarge": (8, 100)}),
    "g6e": (gpus.L40S, {"xlarge": (1, 20), "2xlarge": (1, 20), "4xlarge": (1, 20),
                        "8xlarge": (1, 25),
                    "16xlarge": (1, 35), "12xlarge": (4, 100), "24xlarge": (4, 200),
                    "48xlarge": (8, 400)}),
}

# EFA interfaces per instance (AWS EC2 user guide, EFA-capable instance types).
_EFA_INTERFACES = {
    "ml.p3dn.24xlarge": 1, "ml.p4d.24xlarge": 4, "ml.p4de.24xlarge": 4, "ml.p5.48xlarge": 32,
    "ml.p5e.48xlarge": 32, "ml.p5en.48xlarge": 16, "ml.p6-b200.48xlarge": 8,
}

_TABLE: dict[str, InstanceSpec] = {
    f"ml.{family}.{size}": InstanceSpec(f"ml.{family}.{size}", gpus, gpu, float(net),
                                        _EFA_INTERFACES.get(f"ml.{family}.{size}", 0))
    for family, (gpu, sizes) in _FAMILIES.items()
    for size, (gpus, net) in sizes.items()
}
_TABLE["ml.p3.2xlarge"] = InstanceSpec("ml.p3.2xlarge", 1, gpus.V100_SINGLE, 10.0)

_CPU_NETWORK_GBIT = 10.0  # nominal; only orders communication between layouts

# General-purpose, compute- and memory-optimised families have no GPU.
_CPU_TYPE = re.compile(r"ml\.(m|c|r|t)\d+[a-z]*\.[0-9a-z]+")


def known_instance_types() -> list[str]:
    """Every GPU instance type in the table, sorted."""
    return sorted(_TABLE)


def instance_spec(instance_type: str) -> InstanceSpec:
    """The table row for `instance_type`; CPU types (ml.m5.xlarge, ...) and "local" have 0 GPUs.

    Raises ConfigError for a type the table does not know, with the closest known name.
    """
    if instance_type in _TABLE:
        return _TABLE[instance_type]
    if instance_type == "local" or _CPU_TYPE.fullmatch(instance_type):
        return InstanceSpec(instance_type, 0, None, _CPU_NETWORK_GBIT)
    hint = did_you_mean(instance_type, _TABLE)
    raise ConfigError(
        f"Unknown instance type {instance_type!r}.{hint} Known GPU types: "
        f"{', '.join(known_instance_types())}; CPU types such as ml.m5.xlarge have no GPUs. "
        "For another machine give the GPUs directly (e.g. `meshtrain plan --gpus 8 "
        "--gpu-memory 80`)."
    )


def gpus_per_instance(instance_type: str) -> int:
    """GPUs on one instance of `instance_type` (0 for CPU instance types and "local")."""
    return instance_spec(instance_type).num_gpus


def gpu_memory_gib(instance_type: str) -> float:
    """Memory of one GPU of `instance_type` in GiB as the driver reports it (0.0 without GPUs)."""
    return instance_spec(instance_type).gpu_memory_gib


__all__ = [
    "GPUSpec",
    "InstanceSpec",
    "gpu_memory_gib",
    "gpus_per_instance",
    "instance_spec",
    "known_instance_types",
]
