"""``transform(model)``: apply the parallelism the SMP parameters ask for, in a fixed order.

The order (design.md) lives in one short function, one line per stage:
model converters -> tensor / expert parallelism -> activation checkpointing / offloading ->
FSDP2 (full, hybrid or no sharding) -> materialisation of meta-device models.
Tensor, expert and context parallelism and activation checkpointing / offloading are not part
of this build yet: asking for them raises a ConfigError before the model is touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from meshtrain.errors import ConfigError
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.delayed_init import (
    InitFn,
    check_rank0_has_weights,
    has_meta_tensors,
    load_from_rank0,
    materialize_sharded,
)
from meshtrain_runtime.parallel.blocks import BlockSpec, find_blocks
from meshtrain_runtime.parallel.fsdp import (
    FSDPOptions,
    apply_fsdp,
    data_parallel_mesh,
    resolve_mixed_precision,
    resolve_offload_policy,
)

# (parameter, is it asked for?, what it needs) for the parts this build does not run yet.
_NOT_YET_AVAILABLE = (
    ("tensor_parallel_degree", lambda p: p.tensor_parallel_degree > 1, "tensor parallelism"),
    ("sequence_parallel", lambda p: p.sequence_parallel, "sequence parallelism"),
    ("expert_parallel_degree", lambda p: p.expert_parallel_degree > 1, "expert parallelism"),
    ("context_parallel_degree", lambda p: p.context_parallel_degree > 1, "context parallelism"),
    ("activation_checkpointing", lambda p: p.activation_checkpointing, "activation checkpointing"),
    ("activation_offloading", lambda p: p.activation_offloading, "activation offloading"),
)


def transform(
    model: nn.Module,
    *,
    blocks: BlockSpec | None = None,
    tp_plan: Mapping[str, Any] | None = None,
    moe_config: Any | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    load_state_dict_from_rank0: bool = False,
    init_weights: InitFn | None = None,
) -> nn.Module:
    """Parallelise `model` per the parameters given to `init()`; returns the same module.

    - `blocks`: the repeated layers (list of submodules or their class); default: HF
      ``_no_split_modules``, else repeated ``nn.ModuleList`` children.
    - `tp_plan` / `moe_config`: inputs of tensor / expert parallelism, accepted so that scripts
      written for them run; this build rejects degrees > 1, so they are not used yet.
    - `device`: where parameters live; must be the runtime's device (``state.device``).
    - `dtype`: cast floating-point parameters before sharding (normally keep fp32 and use
      ``mixed_precision``).
    - `load_state_dict_from_rank0`: rank 0 holds real weights, other ranks may be on meta; every
      rank ends with its shard of rank 0's weights.
    - `init_weights(module)`: initialises one module's own tensors when a meta-device model
      has neither HF ``_init_weights`` nor ``reset_parameters``.

    Create the optimizer after `transform` (its parameters are the sharded DTensors).
    """
    st = runtime_state.current()
    _check_request(model, st, device)
    model = apply_converters(model, dtype=dtype)
    rank0_weights = _rank0_state_dict(model, st) if load_state_dict_from_rank0 else None
    block_list = find_blocks(model, blocks)  # after converters, which may swap modules
    # Tensor / expert parallelism, then activation checkpointing / offloading, belong here, in
    # that order; this build rejects them in _check_request.
    model = _apply_data_parallel(model, st, block_list)
    _materialise(model, st, load_state_dict_from_rank0, rank0_weights, init_weights)
    return model


def apply_converters(model: nn.Module, *, dtype: torch.dtype | None = None) -> nn.Module:
    """Model converters that run before any parallelism (today: the parameter dtype)."""
    if dtype is not None:
        if not dtype.is_floating_point:
            raise ConfigError(f"transform(dtype={dtype}) must be a floating-point dtype.")
        model.to(dtype)
    return model


def _apply_data_parallel(
    model: nn.Module, st: runtime_state.RuntimeState, blocks: list[nn.Module]
) -> nn.Module:
    options = FSDPOptions(
        reshard_after_forward=st.degrees.reshard_after_forward,
        mp_policy=resolve_mixed_precision(st.config.mixed_precision),
        offload_policy=resolve_offload_policy(st.config.cpu_offload, st.device.type),
    )
    mesh = data_parallel_mesh(st.mesh, st.replicate_degree)
    return apply_fsdp(model, mesh, blocks=blocks, options=options)


def _materialise(
    model: nn.Module,
    st: runtime_state.RuntimeState,
    from_rank0: bool,
    rank0_weights: dict[str, torch.Tensor] | None,
    init_weights: InitFn | None,
) -> None:
    """Give meta (or rank-0-only) parameters real values, one local shard per rank."""
    # With CPU offload FSDP keeps the sharded parameters in host memory; buffers stay on device.
    param_device = torch.device("cpu") if st.config.cpu_offload else st.device
    if from_rank0:
        load_from_rank0(model, rank0_weights, device=param_device, buffer_device=st.device)
    elif has_meta_tensors(model):
        mesh = data_parallel_mesh(st.mesh, st.replicate_degree)
        materialize_sharded(
            model,
            device=param_device,
            buffer_device=st.device,
            mesh=mesh,
            init_weights=init_weights,
        )


def _check_request(model: nn.Module, st: runtime_state.RuntimeState, device: Any) -> None:
    """Reject what this build cannot do before anything is changed."""
    params = st.config
    for key, asked, feature in _NOT_YET_AVAILABLE:
        if asked(params):
            raise ConfigError(
                f"{key}={getattr(params, key)!r} asks for {feature}, which is not available in "
                f"this build of meshtrain_runtime yet. Remove {key} from the parameters (or set "
                f"it to its default, {type(params).model_fields[key].default!r})."
            )
    resolve_offload_policy(params.cpu_offload, st.device.type)
    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ConfigError(
            "The model is already sharded (transform() or fully_shard() ran on it). Call "
            "transform() once, on the plain model."
        )
    if device is not None and torch.device(device).type != st.device.type:
        raise ConfigError(
            f"transform(device={str(device)!r}) but the runtime's mesh is on {st.device}: FSDP "
            "keeps parameters on the mesh's device. Leave device unset; to keep parameters in "
            "host memory on GPU hosts, use cpu_offload=True."
        )


def _rank0_state_dict(
    model: nn.Module, st: runtime_state.RuntimeState
) -> dict[str, torch.Tensor] | None:
    """Rank 0's full weights, kept before sharding frees them (None on other ranks)."""
    check_rank0_has_weights(model, st.rank, st.device)
    if st.rank != 0:
        return None
    return {key: value.detach() for key, value in model.state_dict().items()}


__all__ = ["apply_converters", "transform"]
