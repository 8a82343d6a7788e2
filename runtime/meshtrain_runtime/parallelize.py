"""``transform(model)``: apply the parallelism the SMP parameters ask for, in a fixed order.

The order (design.md) lives in one short function, one line per stage:
model converters (the parameter dtype; float8 linears in the blocks with ``fp8: true``) ->
the pipeline split (``pipeline_parallel_degree`` > 1: planned and checked here, parallel/
pipeline/; this rank's stages are kept right after TP / EP, which work on the whole model) ->
tensor / expert parallelism -> context parallelism (``context_parallel_degree`` > 1: attention
across the cp ranks, parallel/context_apply.py) -> activation checkpointing / offloading ->
per-block torch.compile (``compile: true``) -> FSDP2 (experts over their own mesh first, then
blocks and root; the sharding group holds the cp ranks, so gradients are reduced over dp x cp)
-> materialisation of meta-device models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis, describe_mesh
from meshtrain.contract.phases import Phase
from meshtrain.contract.support import check_build_support
from meshtrain_runtime import fault
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.delayed_init import (
    InitFn,
    check_rank0_has_weights,
    has_meta_tensors,
    load_from_rank0,
    materialize_sharded,
)
from meshtrain_runtime.host.phases import announce_on_rank_zero
from meshtrain_runtime.modules.moe import MoEConfig
from meshtrain_runtime.parallel.activations import (
    apply_activation_checkpointing,
    resolve_activation_kwargs,
)
from meshtrain_runtime.parallel.blocks import BlockSpec, find_blocks
from meshtrain_runtime.parallel.compile import apply_compile, check_compile
from meshtrain_runtime.parallel.context_apply import (
    ContextSettings,
    apply_context_parallel,
    check_context_parallel,
)
from meshtrain_runtime.parallel.expert import apply_expert_parallel, shard_experts_with_fsdp
from meshtrain_runtime.parallel.expert_tp import tp_plan_without_experts
from meshtrain_runtime.parallel.float8 import apply_float8, check_fp8
from meshtrain_runtime.parallel.fsdp import (
    FSDPOptions,
    apply_fsdp,
    data_parallel_mesh,
    expert_data_parallel_mesh,
    find_embedding_and_head,
    resolve_mixed_precision,
    resolve_offload_policy,
    resolve_reshard_after_forward,
)
from meshtrain_runtime.parallel.pipeline import (
    PipelineModule,
    build_pipeline,
    check_pipeline_request,
    plan_pipeline,
)
from meshtrain_runtime.parallel.quiet import (
    quiet_gather_order_advice,
    quiet_pipeline_stage_view_warnings,
    quiet_tensor_parallel_view_warnings,
)
from meshtrain_runtime.parallel.tensor import apply_tensor_parallel


def transform(
    model: nn.Module,
    *,
    blocks: BlockSpec | None = None,
    tp_plan: Mapping[str, Any] | None = None,
    moe_config: MoEConfig | None = None,
    config: MoEConfig | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    load_state_dict_from_rank0: bool = False,
    init_weights: InitFn | None = None,
    cp_comm_type: str | None = None,
) -> nn.Module:
    """Parallelise `model` per the parameters given to `init()`; returns the same module.

    - `blocks`: the repeated layers (list of submodules or their class); default: HF
      ``_no_split_modules``, else repeated ``nn.ModuleList`` children. They are the units of
      activation checkpointing and of FSDP.
    - `tp_plan`: module name patterns -> tensor-parallel styles (see docs/tensor-parallel.md);
      default: the HF config's ``base_model_tp_plan``. Used when ``tensor_parallel_degree > 1``.
    - `moe_config` (or SMP's spelling ``config=``): a `meshtrain_runtime.modules.moe.MoEConfig` for
      expert parallelism; used when ``expert_parallel_degree > 1``.
    - `device`: where parameters live; must be the runtime's device (``state.device``).
    - `dtype`: cast floating-point parameters before sharding (normally keep fp32 and use
      ``mixed_precision``).
    - `load_state_dict_from_rank0`: rank 0 holds real weights, other ranks may be on meta; every
      rank ends with its shard of rank 0's weights.
    - `init_weights(module)`: initialises one module's own tensors when a meta-device model
      has neither HF ``_init_weights`` nor ``reset_parameters``.
    - `cp_comm_type`: "p2p", "all_gather" or "a2a" (SMP's ``tsm.transform`` argument); default:
      the ``cp_comm_type`` parameter. Used when ``context_parallel_degree > 1``: the model then
      runs on its cp rank's chunks (docs/context-parallel.md).

    Create the optimizer after `transform` (its parameters are the sharded DTensors).
    """
    st = runtime_state.current()
    announce_on_rank_zero(Phase.TRANSFORM, f"{type(model).__name__} on {describe_mesh(st.degrees)}")
    moe_config = _resolve_moe_config(moe_config, config)
    _check_request(model, st, device, load_state_dict_from_rank0)
    context = ContextSettings(
        st.cp_process_group, st.cp_rank, st.cp_size,
        cp_comm_type if cp_comm_type is not None else st.config.cp_comm_type,
        tp_size=st.tp_size)
    check_context_parallel(model, context)
    model = apply_converters(model, dtype=dtype)
    rank0_weights = _rank0_state_dict(model, st) if load_state_dict_from_rank0 else None
    block_list = find_blocks(model, blocks)  # after converters, before any class swap
    activation_kwargs = _check_blocks(model, block_list, resolve_activation_kwargs(st.config))
    if st.config.compile:
        check_compile(
            blocks=block_list, device_type=st.device.type,
            activation_offloading=st.config.activation_offloading,
            activation_checkpointing=st.config.activation_checkpointing,
            tensor_parallel_degree=st.tensor_parallel_degree,
            expert_parallel_degree=st.expert_parallel_degree,
        )
    if st.config.fp8:  # a converter too, once the blocks are known: before any parallelism
        apply_float8(model, block_list, fsdp_float8_all_gather=st.hybrid_shard_degree > 1)
    pipeline = None
    if st.pipeline_parallel_degree > 1:  # checked on every rank before anything changes
        pipeline = plan_pipeline(model, block_list, params=st.config)
    # TP/EP on the whole model (its plan names the whole model's paths), then only this rank's
    # stages are kept: they hold the modules TP/EP sharded or swapped, under the original names.
    model = apply_model_parallel(model, st, tp_plan=tp_plan, moe_config=moe_config)
    if pipeline is not None:
        model = build_pipeline(model, pipeline, params=st.config, pp_rank=st.pp_rank)
        block_list = model.local_blocks()
    if st.context_parallel_degree > 1:  # before checkpointing: its recompute attends across cp
        apply_context_parallel(model, block_list, context)
    if activation_kwargs is not None:
        apply_activation_checkpointing(model, block_list, **activation_kwargs)
    if st.config.compile:  # after TP/EP and checkpointing, before FSDP2 (torchtitan's order)
        apply_compile(model, block_list)
    model = _apply_data_parallel(model, st, block_list)
    _materialise(model, st, load_state_dict_from_rank0, rank0_weights, init_weights)
    fault.attach_model(model)  # replica groups: quorum, gradient average, healing
    return model


def apply_converters(model: nn.Module, *, dtype: torch.dtype | None = None) -> nn.Module:
    """Model converters that run before any parallelism (today: the parameter dtype)."""
    if dtype is not None:
        if not dtype.is_floating_point:
            raise ConfigError(f"transform(dtype={dtype}) must be a floating-point dtype.")
        model.to(dtype)
    return model


def apply_model_parallel(
    model: nn.Module,
    st: runtime_state.RuntimeState,
    *,
    tp_plan: Mapping[str, Any] | None = None,
    moe_config: MoEConfig | None = None,
) -> nn.Module:
    """Tensor parallelism on the ``tp`` axis, then expert parallelism on ``state.expert_mesh``.

    Both at once (a meshtrain extension; SMP refuses it): TP leaves the experts out of the HF
    plan (`tp_plan_without_experts`), and EP splits each tp rank's share of the tokens.
    """
    params = st.config
    tp_mesh = st.mesh[MeshAxis.TP] if st.tensor_parallel_degree > 1 else None
    if tp_mesh is not None:
        if st.expert_mesh is not None and tp_plan is None:
            tp_plan = tp_plan_without_experts(model)
        model = apply_tensor_parallel(
            model,
            tp_mesh,
            plan=tp_plan,
            sequence_parallel=params.sequence_parallel,
            loss_parallel=params.loss_parallel,
            random_seed=params.random_seed,
        )
    if st.expert_mesh is not None:
        model = apply_expert_parallel(
            model, st.expert_mesh, moe_config=moe_config, tp_mesh=tp_mesh
        )
    return model


def _apply_data_parallel(
    model: nn.Module, st: runtime_state.RuntimeState, blocks: list[nn.Module]
) -> nn.Module:
    options = FSDPOptions(
        reshard_after_forward=resolve_reshard_after_forward(
            st.config.reshard_after_forward, st.degrees.reshard_after_forward
        ),
        mp_policy=resolve_mixed_precision(st.config.mixed_precision),
        offload_policy=resolve_offload_policy(st.config.cpu_offload, st.device.type),
    )
    if not uses_fsdp(st, options):
        return model
    if st.expert_mesh is not None or st.tensor_parallel_degree > 1:
        quiet_gather_order_advice()  # full-tensor gathers over two axes: see quiet.py
    if st.expert_mesh is not None:  # experts first: the block-level groups then skip them
        expert_mesh = expert_data_parallel_mesh(st.expert_mesh, st.replicate_degree)
        shard_experts_with_fsdp(
            model,
            expert_mesh,
            reshard_after_forward=options.reshard_after_forward,
            mp_policy=options.mp_policy,
            offload_policy=options.offload_policy,
        )
    mesh = data_parallel_mesh(st.mesh, st.replicate_degree)
    if st.tensor_parallel_degree > 1:  # the TP outputs FSDP2 warns about: see quiet.py
        quiet_tensor_parallel_view_warnings([*find_embedding_and_head(model, blocks), model])
    if isinstance(model, PipelineModule):  # FSDP2 per stage: a stage's root is what runs
        quiet_pipeline_stage_view_warnings(model.stage_modules)
        for stage in model.stage_modules:
            apply_fsdp(stage, mesh, blocks=stage.stage_blocks(), options=options)
        model.refresh_tensors()  # FSDP2 replaced the tensors stages read by attribute
        return model
    return apply_fsdp(model, mesh, blocks=blocks, options=options)


def uses_fsdp(st: runtime_state.RuntimeState, options: FSDPOptions) -> bool:
    """False only for one data-parallel rank under tensor or pipeline parallelism (each rank
    then holds its own part of the model) with no FSDP policy.

    FSDP over a group of one would only copy every parameter into a gather buffer and back
    (with pipelining at pp2 on 2 ranks: 5-7 % of a step, benchmarks/RESULTS.md runs 15, 19).
    Mixed precision and CPU offload are FSDP policies, so they keep FSDP (over one rank).
    """
    split = st.tensor_parallel_degree > 1 or st.pipeline_parallel_degree > 1
    if not split or st.degrees.data_parallel_degree > 1:
        return True
    casts = options.mp_policy.param_dtype is not None
    return casts or isinstance(options.offload_policy, CPUOffloadPolicy)


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
        materialize_sharded(
            model,
            device=param_device,
            buffer_device=st.device,
            mesh=st.mesh,
            init_weights=init_weights,
        )


def _resolve_moe_config(
    moe_config: MoEConfig | None, config: MoEConfig | None
) -> MoEConfig | None:
    """`moe_config=` or SMP's ``config=`` (``tsm.transform(model, config=MoEConfig(...))``)."""
    if moe_config is not None and config is not None:
        raise ConfigError(
            "transform() got both moe_config= and config=: they are the same argument (config= "
            "is SMP v2's name). Pass one MoEConfig."
        )
    chosen = moe_config if moe_config is not None else config
    if chosen is not None and not isinstance(chosen, MoEConfig):
        raise ConfigError(
            f"transform(moe_config=...) takes a meshtrain_runtime.modules.moe.MoEConfig, got "
            f"{type(chosen).__name__}. Build it as MoEConfig(moe_aux_loss_coeff=..., ...)."
        )
    return chosen


def _check_request(
    model: nn.Module, st: runtime_state.RuntimeState, device: Any, from_rank0: bool
) -> None:
    """Reject what this build cannot do before anything is changed."""
    params = st.config
    check_model_parallel_request(st, device=device, load_state_dict_from_rank0=from_rank0)
    resolve_offload_policy(params.cpu_offload, st.device.type)
    check_fp8(params.fp8, st.device)
    if st.pipeline_parallel_degree > 1:
        check_pipeline_request(model, from_rank0)
    if isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules()):
        raise ConfigError(
            "The model is already sharded (transform() or fully_shard() ran on it). Call "
            "transform() once, on the plain model."
        )


def check_model_parallel_request(
    st: runtime_state.RuntimeState, *, device: Any, load_state_dict_from_rank0: bool
) -> None:
    """The checks of every model conversion, `transform` and SMP's ``tsm.transform`` alike:
    what this build runs, rank-0 weights with TP, the device. Raise ConfigError."""
    check_build_support(st.config, st.tensor_parallel_degree)  # the client runs it too
    if load_state_dict_from_rank0 and st.tensor_parallel_degree > 1:
        raise ConfigError(
            f"load_state_dict_from_rank0=True with tensor_parallel_degree="
            f"{st.tensor_parallel_degree}: tensor parallelism splits weights by collectives "
            "that need the same (real or meta) model on every rank. Build the model with its "
            "real weights on every rank, or load a sharded checkpoint after transform()."
        )
    if device is not None and torch.device(device).type != st.device.type:
        raise ConfigError(
            f"transform(device={str(device)!r}) but the runtime's mesh is on {st.device}: FSDP "
            "keeps parameters on the mesh's device. Leave device unset; to keep parameters in "
            "host memory on GPU hosts, use cpu_offload=True."
        )


def _check_blocks(
    model: nn.Module, blocks: list[nn.Module], activation_kwargs: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Checkpointing needs blocks: say so before tensor / expert parallelism change the model."""
    if activation_kwargs is not None and not blocks:
        raise ConfigError(
            f"activation_checkpointing=True but no transformer blocks were found in "
            f"{type(model).__name__}: checkpointing works per block. Pass them, e.g. "
            "transform(model, blocks=list(model.layers)), or set activation_checkpointing=False."
        )
    return activation_kwargs


def _rank0_state_dict(
    model: nn.Module, st: runtime_state.RuntimeState
) -> dict[str, torch.Tensor] | None:
    """Rank 0's full weights, kept before sharding frees them (None on other ranks)."""
    check_rank0_has_weights(model, st.rank, st.device)
    if st.rank != 0:
        return None
    return {key: value.detach() for key, value in model.state_dict().items()}


__all__ = [
    "apply_converters",
    "apply_model_parallel",
    "check_model_parallel_request",
    "transform",
    "uses_fsdp",
]
