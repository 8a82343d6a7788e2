"""Sharded data parallelism on FSDP2 (``fully_shard``): full, hybrid and no sharding.

Layout (torchtitan's): every block gets its own ``fully_shard``, the input embedding too, the
output head gets one that is not resharded after forward (backward needs it at once), then the
root takes whatever is left (final norm, tied or stray parameters). Parameters shared between
an embedding/head and the rest of the model (tied word embeddings) stay in the root group:
FSDP2 cannot put one parameter in two groups.

Mesh: the (replicate, shard) axes of the runtime's mesh. With a single replica the 1-D ``shard``
axis is used (plain FSDP: no all-reduce over a replicate group of one); ``no_shard`` is shard
degree 1 on the 2-D mesh, i.e. every rank holds everything and gradients are all-reduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain.contract.support import check_cpu_offload
from meshtrain_runtime.torch_api import fsdp2_unsharded_parameters

_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None, None: None}


@dataclass(frozen=True)
class FSDPOptions:
    """Plain keyword options of `apply_fsdp` (never the whole runtime config)."""

    reshard_after_forward: bool = True
    mp_policy: MixedPrecisionPolicy = field(default_factory=MixedPrecisionPolicy)
    offload_policy: OffloadPolicy = field(default_factory=OffloadPolicy)

    def kwargs(self, mesh: DeviceMesh) -> dict:
        return {"mesh": mesh, "mp_policy": self.mp_policy, "offload_policy": self.offload_policy}


def resolve_mixed_precision(mixed_precision: str | None) -> MixedPrecisionPolicy:
    """`mixed_precision` ("bf16" | "fp16" | "fp32" | None) -> policy; gradients reduce in fp32."""
    if mixed_precision not in _PARAM_DTYPES:
        raise ConfigError(
            f"mixed_precision={mixed_precision!r} is not one of 'bf16', 'fp16', 'fp32' or None."
        )
    param_dtype = _PARAM_DTYPES[mixed_precision]
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def resolve_offload_policy(cpu_offload: bool, device_type: str) -> OffloadPolicy:
    """`cpu_offload` -> CPUOffloadPolicy (ZeRO-Offload); a ConfigError on a host without GPUs.

    On a CPU-only process parameters, gradients and optimizer state already live in host memory,
    so there is nothing to offload from; silently ignoring the key would hide a job that was
    meant for GPU hosts, hence the error.
    """
    if not cpu_offload:
        return OffloadPolicy()
    check_cpu_offload(cpu_offload, device_type)  # the client runs the same check
    return CPUOffloadPolicy(pin_memory=True)


def resolve_reshard_after_forward(setting: bool | str, strategy_default: bool) -> bool:
    """The ``reshard_after_forward`` key: True / False as given, "auto" the strategy's default.

    "auto" keeps SMP's meaning of the strategies: full / hybrid shard reshard after forward,
    shard_grad_op, _hybrid_shard_zero2 and no_shard keep gathered parameters until backward.
    """
    if setting == "auto":
        return strategy_default
    if not isinstance(setting, bool):
        raise ConfigError(
            f"reshard_after_forward={setting!r} must be true, false or \"auto\"."
        )
    return setting


def unsharded_parameter_bytes(model: nn.Module) -> int:
    """Bytes of FSDP2 parameters held gathered (unsharded) right now, on this rank.

    Between forward and backward this is what ``reshard_after_forward=False`` keeps alive: every
    group's gathered parameters in the compute dtype. It reads the storages FSDP2 allocated for
    the gathered parameters (a freed one has size 0), so it works on CPU as on GPU.
    """
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        for unsharded in fsdp2_unsharded_parameters(module):
            storage = unsharded.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def data_parallel_mesh(mesh: DeviceMesh, replicate_degree: int) -> DeviceMesh:
    """The FSDP mesh: ("replicate", "shard") for several replicas, else the 1-D "shard" axis."""
    if replicate_degree == 1:
        return mesh[MeshAxis.SHARD]
    return mesh[MeshAxis.REPLICATE, MeshAxis.SHARD]


def expert_data_parallel_mesh(expert_mesh: DeviceMesh, replicate_degree: int) -> DeviceMesh:
    """The FSDP mesh of expert weights: the ranks holding the same experts.

    ("replicate", "shard_mod_ep") for several replicas, else the 1-D "shard_mod_ep" axis of
    ``state.expert_mesh`` (see `meshtrain_runtime.parallel.expert.shard_experts_with_fsdp`).
    """
    if replicate_degree == 1:
        return expert_mesh[MeshAxis.SHARD_MOD_EP]
    return expert_mesh[MeshAxis.REPLICATE, MeshAxis.SHARD_MOD_EP]


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    blocks: Sequence[nn.Module],
    options: FSDPOptions,
) -> nn.Module:
    """Apply ``fully_shard`` to each block, the input embedding, the output head, then the root.

    `mesh` is 1-D (shard) or 2-D (replicate, shard). Returns `model` (now an FSDPModule).
    """
    kwargs = options.kwargs(mesh)
    embedding, head = find_embedding_and_head(model, blocks)
    if embedding is not None:
        fully_shard(embedding, reshard_after_forward=options.reshard_after_forward, **kwargs)
    for block in blocks:
        fully_shard(block, reshard_after_forward=options.reshard_after_forward, **kwargs)
    if head is not None:
        fully_shard(head, reshard_after_forward=False, **kwargs)
    fully_shard(model, **kwargs)
    return model


def find_embedding_and_head(
    model: nn.Module, blocks: Sequence[nn.Module]
) -> tuple[nn.Module | None, nn.Module | None]:
    """HF ``get_input_embeddings`` / ``get_output_embeddings`` that can be grouped on their own.

    A module is left to the root group when it is the root, lies inside a block, or shares a
    parameter with the rest of the model (tied embeddings).
    """
    candidates = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = _call_getter(model, getter)
        candidates.append(module if _can_group(model, module, blocks) else None)
    embedding, head = candidates
    return embedding, head


def _call_getter(model: nn.Module, name: str) -> nn.Module | None:
    getter = getattr(model, name, None)
    if not callable(getter):
        return None
    try:
        module = getter()
    except (NotImplementedError, AttributeError):
        return None
    return module if isinstance(module, nn.Module) else None


def _can_group(model: nn.Module, module: nn.Module | None, blocks: Sequence[nn.Module]) -> bool:
    if module is None or module is model or not any(True for _ in module.parameters()):
        return False
    inside = {id(m) for m in module.modules()}
    block_parts = {id(sub) for block in blocks for sub in block.modules()}
    if inside & block_parts:  # inside a block, or holding one
        return False
    own = {id(p) for p in module.parameters()}
    for sub in model.modules():
        if id(sub) not in inside and any(id(p) in own for p in sub.parameters(recurse=False)):
            return False  # tied to a parameter outside the module
    return True


__all__ = [
    "FSDPOptions",
    "apply_fsdp",
    "data_parallel_mesh",
    "expert_data_parallel_mesh",
    "find_embedding_and_head",
    "resolve_mixed_precision",
    "resolve_offload_policy",
    "resolve_reshard_after_forward",
    "unsharded_parameter_bytes",
]
