"""GPU models: memory the driver reports, dense half-precision peak, in-node bandwidth.

Shared by the planner (which ranks layouts with these speeds) and the runtime's throughput metrics
(MFU = achieved FLOP/s over this peak). Sources: GPU memory as the driver reports it
(``nvidia-smi --query-gpu=memory.total``, MiB / 1024: an "80 GB" H100 reports 81559 MiB =
79.6 GiB); peak dense bf16/fp16 tensor-core TFLOP/s (no sparsity) and per-GPU NVLink/PCIe bandwidth
(one direction) from NVIDIA's data sheets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: memory the driver reports, dense half-precision peak, in-node bandwidth."""

    name: str
    memory_gib: float
    peak_tflops: float
    link_gbytes_per_s: float
    """Per-GPU bandwidth to the other GPUs of the node, one direction (NVLink or PCIe)."""


V100_16 = GPUSpec("V100-SXM2-16GB", 16160 / 1024, 125.0, 150.0)
V100_32 = GPUSpec("V100-SXM2-32GB", 32510 / 1024, 125.0, 150.0)
V100_SINGLE = GPUSpec("V100-SXM2-16GB", 16160 / 1024, 125.0, 0.0)
T4 = GPUSpec("T4", 15360 / 1024, 65.0, 12.0)
A10G = GPUSpec("A10G", 23028 / 1024, 70.0, 25.0)
L4 = GPUSpec("L4", 23034 / 1024, 121.0, 25.0)
L40S = GPUSpec("L40S", 46068 / 1024, 362.0, 25.0)
A100_40 = GPUSpec("A100-SXM4-40GB", 40960 / 1024, 312.0, 300.0)
A100_80 = GPUSpec("A100-SXM4-80GB", 81920 / 1024, 312.0, 300.0)
H100 = GPUSpec("H100-SXM5-80GB", 81559 / 1024, 989.0, 450.0)
H100_PCIE = GPUSpec("H100-PCIe-80GB", 81559 / 1024, 756.0, 64.0)
H200 = GPUSpec("H200-SXM-141GB", 143771 / 1024, 989.0, 450.0)
B200 = GPUSpec("B200-180GB", 183359 / 1024, 2250.0, 900.0)

# Words of torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", ...),
# most specific first: "H100 PCIe" must win over "H100".
_BY_DEVICE_NAME: tuple[tuple[tuple[str, ...], GPUSpec], ...] = (
    (("H100", "PCIE"), H100_PCIE),
    (("H100",), H100),
    (("H200",), H200),
    (("B200",), B200),
    (("A100", "40GB"), A100_40),
    (("A100",), A100_80),
    (("V100", "32GB"), V100_32),
    (("V100",), V100_16),
    (("L40S",), L40S),
    (("A10G",), A10G),
    (("L4",), L4),
    (("T4",), T4),
)


def gpu_spec_for_device(device_name: str) -> GPUSpec | None:
    """The table row for a device name as CUDA reports it, or None for one the table lacks."""
    words = device_name.upper().replace("-", " ").split()
    for keys, spec in _BY_DEVICE_NAME:
        if all(key in words for key in keys):
            return spec
    return None
