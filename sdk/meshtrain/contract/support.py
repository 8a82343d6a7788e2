"""What this build of the runtime can run: one set of checks that the client and the runtime share.

The runtime calls these before it touches a model; the Estimator calls the same functions before a
job is launched, so a setting the runtime would refuse is refused on the user's machine, with the
same message, instead of minutes later on every rank.
"""

from __future__ import annotations

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.distribution import SMPParameters
from meshtrain.contract.errors import ConfigError


def check_build_support(params: SMPParameters, tensor_parallel_degree: int) -> None:
    """Refuse parameters this build does not run: SP/loss-parallel sans TP, fp8 with TP."""
    for key in ("sequence_parallel", "loss_parallel"):
        if getattr(params, key) and tensor_parallel_degree == 1:
            raise ConfigError(
                f"{key}=True splits activations over the tensor-parallel ranks, but "
                "tensor_parallel_degree=1: there is nothing to split. Set "
                f"tensor_parallel_degree >= 2 or {key}=False."
            )
    if params.fp8 and tensor_parallel_degree > 1:
        raise ConfigError(
            f"fp8=True with tensor_parallel_degree={tensor_parallel_degree}: float8 matmuls on "
            "tensor-parallel shards need torchao's float8 TP styles, which this build does not "
            "apply. Use fp8 with sharded data parallelism (hybrid_shard_degree) or expert "
            "parallelism, or set fp8=False (mixed_precision='bf16' works with TP)."
        )


def check_cpu_offload(cpu_offload: bool, device_type: str) -> None:
    """`cpu_offload` needs an accelerator to offload from; `device_type` is "cpu" or "cuda".

    On a CPU-only process parameters, gradients and optimizer state already live in host memory,
    so silently ignoring the key would hide a job that was meant for GPU hosts.
    """
    if cpu_offload and device_type == "cpu":
        raise ConfigError(
            "cpu_offload=True moves parameters, gradients and optimizer state from the "
            "accelerator to host memory, but this process runs on the CPU (no CUDA device): "
            "there is nothing to offload from. Set cpu_offload=False here (the states already "
            "live in host memory), or run on GPU hosts."
        )


def check_fp8_device(fp8: bool, device_type: str) -> None:
    """`fp8` needs float8 tensor cores, i.e. a CUDA GPU; `device_type` is "cpu" or "cuda"."""
    if fp8 and device_type != "cuda":
        raise ConfigError(
            "fp8=True trains linear layers with float8 matmuls (torchao float8 training), which "
            "need float8 tensor cores: an H100-class NVIDIA GPU (compute capability 9.0+), but "
            f"the ranks run on the {device_type.upper()} (no CUDA device). Set fp8=False "
            "(mixed_precision='bf16' is the recommended setting), or run on H100-class GPUs."
        )


def degenerate_layout_notes(params: SMPParameters, degrees: ResolvedDegrees) -> list[str]:
    """Layouts that were asked for but resolve to something plainer (said once, not refused).

    Example: ``sharding_strategy='hybrid_shard'`` with one rank per host resolves to a shard
    degree of 1, i.e. plain replication (DDP-like, no memory saved by sharding).
    """
    notes = []
    asked = params.sharding_strategy
    if asked in ("hybrid_shard", "_hybrid_shard_zero2", "full_shard", "shard_grad_op") and (
            degrees.hybrid_shard_degree == 1 and degrees.world_size > 1):
        notes.append(
            f"sharding_strategy={asked!r} resolves to hybrid_shard_degree=1 in world size "
            f"{degrees.world_size}: every rank keeps a full replica (plain data parallelism, no "
            "memory saved by sharding). Set hybrid_shard_degree >= 2 (or more processes per "
            "host), or say sharding_strategy='no_shard' if replication is what you want."
        )
    if degrees.world_size == 1 and asked not in (None, "no_shard"):
        notes.append(f"sharding_strategy={asked!r} in a job of one rank has no effect: there is "
                     "nothing to shard over. Add processes or hosts, or drop sharding_strategy.")
    return notes


def check_restarts_supported(max_restarts: int, target: str) -> None:
    """A target that does not restart jobs refuses torch_distributed.max_restarts > 0."""
    if max_restarts:
        raise ConfigError(
            f"torch_distributed.max_restarts={max_restarts}: {target} jobs are not restarted "
            "by meshtrain; local jobs (the supervisor restarts every host) and Kubernetes "
            "PyTorchJobs (elasticPolicy.maxRestarts) are. Remove it, or resume from "
            "latest_checkpoint() in a new job.")


def check_fault_tolerance_supported(replica_groups: int | None, target: str, why: str) -> None:
    """A target that cannot restart one replica group alone refuses
    torch_distributed.fault_tolerance; `why` says what it lacks."""
    if replica_groups:
        raise ConfigError(
            f"torch_distributed.fault_tolerance (replica_groups={replica_groups}) is not run on "
            f"{target}: {why}. Run it as local processes (instance_type='local'), or remove "
            "fault_tolerance (max_restarts restarts every host from the last checkpoint where "
            "the target supports it).")


def check_stop_grace_supported(grace_seconds: int, target: str, limit: int) -> None:
    """A target that SIGKILLs `limit` seconds after SIGTERM refuses a longer grace period."""
    if grace_seconds > limit:
        raise ConfigError(
            f"torch_distributed.stop_grace_seconds={grace_seconds}: {target} sends SIGKILL "
            f"{limit} s after SIGTERM, so ranks cannot get {grace_seconds} s to save. Use at "
            f"most {limit} (save more often, or asynchronously, if {limit} s is not enough).")
