"""The cluster a plan is for: ranks per host, hosts, GPU memory and nominal speeds."""

from __future__ import annotations

from dataclasses import dataclass

from meshtrain.contract.errors import ConfigError
from meshtrain.instances import instance_spec

GIB = 1024**3

DEFAULT_GPU_MEMORY_GIB = 80.0
"""`--gpus N` without `--gpu-memory`: an 80 GiB GPU (A100-80GB / H100 class)."""
DEFAULT_RESERVE_FIXED_GIB = 1.0
"""Per GPU: CUDA context and NCCL communicator buffers."""
DEFAULT_RESERVE_FRACTION = 0.05
"""Per GPU: allocator fragmentation, as a fraction of the GPU's memory."""

# Nominal speeds for `--gpus N` clusters (an A100-80GB node: p4de.24xlarge).
_GENERIC_PEAK_TFLOPS = 312.0
_GENERIC_LINK_GBYTES = 300.0
_GENERIC_NETWORK_GBIT = 400.0
_HOST_COPY_GBYTES = 10.0  # processes of a CPU host exchange through shared memory


@dataclass(frozen=True)
class Cluster:
    """`num_nodes` hosts of `ranks_per_node` ranks; every rank owns `gpu_memory_bytes`."""

    num_nodes: int
    ranks_per_node: int
    gpu_memory_bytes: int
    reserve_bytes: int
    peak_flops: float
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    """Network bandwidth of one host (all its GPUs together)."""
    instance_type: str | None = None

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def capacity_bytes(self) -> int | None:
        """Memory a rank may fill (GPU memory minus the reserve); None when there is no GPU."""
        if self.gpu_memory_bytes <= 0:
            return None
        return self.gpu_memory_bytes - self.reserve_bytes

    @property
    def rank_unit(self) -> str:
        """What one rank runs on: "GPU", or "CPU rank" for hosts without GPUs ("local")."""
        return "GPU" if self.gpu_memory_bytes > 0 or self.peak_flops > 0 else "CPU rank"

    @property
    def description(self) -> str:
        what = self.instance_type or f"{self.gpu_memory_bytes / GIB:.0f} GiB GPUs"
        if self.rank_unit != "GPU":
            what += ", CPU ranks"
        return (f"{self.num_nodes} x {what} ({self.ranks_per_node} ranks per host, world size "
                f"{self.world_size})")


def default_reserve_gib(gpu_memory_gib: float) -> float:
    """1 GiB (CUDA context, NCCL) plus 5 % of the GPU for allocator fragmentation."""
    if gpu_memory_gib <= 0:
        return 0.0
    return DEFAULT_RESERVE_FIXED_GIB + DEFAULT_RESERVE_FRACTION * gpu_memory_gib


def build_cluster(
    *,
    instance_type: str | None = None,
    instance_count: int = 1,
    gpus: int | None = None,
    gpu_memory_gib: float | None = None,
    gpus_per_node: int | None = None,
    processes_per_host: int | None = None,
    reserve_gib: float | None = None,
) -> Cluster:
    """A cluster from an `ml.*` instance type x count, or from `gpus` (and `gpu_memory_gib`).

    `processes_per_host` overrides the ranks per host (default: the instance's GPUs); when it
    exceeds the GPUs, ranks share a GPU's memory evenly.
    """
    if instance_count < 1:
        raise ConfigError(f"instance_count={instance_count} must be at least 1.")
    if instance_type is not None and gpus is not None:
        raise ConfigError("Give either an instance type (with a count) or --gpus, not both.")
    if instance_type is not None:
        return _from_instance(instance_type, instance_count, processes_per_host,
                              gpu_memory_gib, reserve_gib)
    if gpus is None:
        raise ConfigError("Name a cluster: an instance type (e.g. --instance-type "
                          "ml.p4d.24xlarge --instance-count 2) or --gpus N [--gpu-memory GiB].")
    return _from_gpus(gpus, gpu_memory_gib, gpus_per_node, reserve_gib)


def _from_instance(
    instance_type: str, count: int, processes_per_host: int | None,
    gpu_memory_gib: float | None, reserve_gib: float | None,
) -> Cluster:
    spec = instance_spec(instance_type)
    ranks = processes_per_host or max(spec.num_gpus, 1)
    memory_gib = spec.gpu_memory_gib if gpu_memory_gib is None else gpu_memory_gib
    if spec.num_gpus and ranks > spec.num_gpus:
        memory_gib *= spec.num_gpus / ranks  # ranks share the GPUs' memory
    gpu = spec.gpu
    reserve = default_reserve_gib(memory_gib) if reserve_gib is None else reserve_gib
    return Cluster(
        num_nodes=count,
        ranks_per_node=ranks,
        gpu_memory_bytes=int(memory_gib * GIB),
        reserve_bytes=int(reserve * GIB),
        peak_flops=(gpu.peak_tflops if gpu else 0.0) * 1e12,
        intra_node_bytes_per_s=(gpu.link_gbytes_per_s if gpu else _HOST_COPY_GBYTES) * 1e9,
        inter_node_bytes_per_s=spec.network_gbit_per_s * 1e9 / 8,
        instance_type=instance_type,
    )


def _from_gpus(
    gpus: int, gpu_memory_gib: float | None, gpus_per_node: int | None, reserve_gib: float | None
) -> Cluster:
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: need at least one GPU.")
    per_node = gpus_per_node or min(gpus, 8)
    if gpus % per_node:
        raise ConfigError(
            f"--gpus {gpus} is not a whole number of nodes of {per_node} GPUs "
            f"({gpus} / {per_node} = {gpus / per_node:.2f}). Use a multiple of {per_node} or "
            "set --gpus-per-node."
        )
    memory_gib = DEFAULT_GPU_MEMORY_GIB if gpu_memory_gib is None else gpu_memory_gib
    if memory_gib <= 0:
        raise ConfigError(f"--gpu-memory {memory_gib}: must be positive (GiB per GPU).")
    reserve = default_reserve_gib(memory_gib) if reserve_gib is None else reserve_gib
    return Cluster(
        num_nodes=gpus // per_node,
        ranks_per_node=per_node,
        gpu_memory_bytes=int(memory_gib * GIB),
        reserve_bytes=int(reserve * GIB),
        peak_flops=_GENERIC_PEAK_TFLOPS * 1e12,
        intra_node_bytes_per_s=_GENERIC_LINK_GBYTES * 1e9,
        inter_node_bytes_per_s=_GENERIC_NETWORK_GBIT * 1e9 / 8,
    )


__all__ = ["GIB", "Cluster", "build_cluster", "default_reserve_gib"]
