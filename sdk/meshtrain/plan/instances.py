"""SageMaker `ml.*` instance types: GPUs per instance, GPU memory, and nominal speeds.

The SageMaker backend needs `gpus_per_instance` (how many processes torchrun starts per host);
the planner also needs the GPU memory and the nominal speeds it ranks layouts with.

Sources: GPU counts and instance network bandwidth from the AWS EC2 accelerated-computing
instance pages; GPU memory as the driver reports it (``nvidia-smi --query-gpu=memory.total``,
MiB / 1024: an "80 GB" H100 reports 81559 MiB = 79.6 GiB); peak dense bf16/fp16 tensor-core
TFLOP/s and per-GPU NVLink/PCIe bandwidth (one direction) from NVIDIA's data sheets. Speeds
only rank layouts against each other; they are not a promise of step time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshtrain.contract._messages import did_you_mean
from meshtrain.errors import ConfigError


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: memory the driver reports, dense half-precision peak, in-node bandwidth."""

    name: str
    memory_gib: float
    peak_tflops: float
    link_gbytes_per_s: float
    """Per-GPU bandwidth to the other GPUs of the node, one direction (NVLink or PCIe)."""


@dataclass(frozen=True)
class InstanceSpec:
    """One `ml.*` instance type."""

    instance_type: str
    num_gpus: int
    gpu: GPUSpec | None
    network_gbit_per_s: float

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu.memory_gib if self.gpu else 0.0


_V100_16 = GPUSpec("V100-SXM2-16GB", 16160 / 1024, 125.0, 150.0)
_V100_32 = GPUSpec("V100-SXM2-32GB", 32510 / 1024, 125.0, 150.0)
_V100_1 = GPUSpec("V100-SXM2-16GB", 16160 / 1024, 125.0, 0.0)
_T4 = GPUSpec("T4", 15360 / 1024, 65.0, 12.0)
_A10G = GPUSpec("A10G", 23028 / 1024, 70.0, 25.0)
_L4 = GPUSpec("L4", 23034 / 1024, 121.0, 25.0)
_L40S = GPUSpec("L40S", 46068 / 1024, 362.0, 25.0)
_A100_40 = GPUSpec("A100-SXM4-40GB", 40960 / 1024, 312.0, 300.0)
_A100_80 = GPUSpec("A100-SXM4-80GB", 81920 / 1024, 312.0, 300.0)
_H100 = GPUSpec("H100-SXM5-80GB", 81559 / 1024, 989.0, 450.0)
_H200 = GPUSpec("H200-SXM-141GB", 143771 / 1024, 989.0, 450.0)
_B200 = GPUSpec("B200-180GB", 183359 / 1024, 2250.0, 900.0)

# (gpu, {size: (gpus, network Gbit/s)}) per family; "up to" network figures use the burst value.
_FAMILIES: dict[str, tuple[GPUSpec, dict[str, tuple[int, float]]]] = {
    "p3": (_V100_16, {"8xlarge": (4, 10), "16xlarge": (8, 25)}),
    "p3dn": (_V100_32, {"24xlarge": (8, 100)}),
    "p4d": (_A100_40, {"24xlarge": (8, 400)}),
    "p4de": (_A100_80, {"24xlarge": (8, 400)}),
    "p5": (_H100, {"48xlarge": (8, 3200)}),
    "p5e": (_H200, {"48xlarge": (8, 3200)}),
    "p5en": (_H200, {"48xlarge": (8, 3200)}),
    "p6-b200": (_B200, {"48xlarge": (8, 3200)}),
    "g4dn": (_T4, {"xlarge": (1, 25), "2xlarge": (1, 25), "4xlarge": (1, 25),
                   "8xlarge": (1, 50), "16xlarge": (1, 50), "12xlarge": (4, 50)}),
    "g5": (_A10G, {"xlarge": (1, 10), "2xlarge": (1, 10), "4xlarge": (1, 25), "8xlarge": (1, 25),
                   "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50),
                   "48xlarge": (8, 100)}),
    "g6": (_L4, {"xlarge": (1, 10), "2xlarge": (1, 10), "4xlarge": (1, 25), "8xlarge": (1, 25),
                 "16xlarge": (1, 25), "12xlarge": (4, 40), "24xlarge": (4, 50),
                 "48xlarge": (8, 100)}),
    "g6e": (_L40S, {"xlarge": (1, 20), "2xlarge": (1, 20), "4xlarge": (1, 20), "8xlarge": (1, 25),
                    "16xlarge": (1, 35), "12xlarge": (4, 100), "24xlarge": (4, 200),
                    "48xlarge": (8, 400)}),
}

_TABLE: dict[str, InstanceSpec] = {
    f"ml.{family}.{size}": InstanceSpec(f"ml.{family}.{size}", gpus, gpu, float(net))
    for family, (gpu, sizes) in _FAMILIES.items()
    for size, (gpus, net) in sizes.items()
}
_TABLE["ml.p3.2xlarge"] = InstanceSpec("ml.p3.2xlarge", 1, _V100_1, 10.0)

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
