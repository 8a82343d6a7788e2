"""``tsm.transform``: SMP's model conversion only (tensor / expert / context parallelism, dtype).

Unlike ``meshtrain_runtime.transform`` (which also applies FSDP2, checkpointing and
materialisation), SMP's transform leaves sharding to the script's own FSDP call. The model's
transformer blocks are marked so that ``tsm.tensor_parallel.transformer.TransformerLayer``
matches them in FSDP's ``transformer_auto_wrap_policy`` and activation checkpointing's
``check_fn``. A model on the meta device stays there: FSDP's ``param_init_fn`` (from
``DelayedParamIniter``) gives it real values shard by shard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.compat.smp._fsdp import compat_meshes
from meshtrain_runtime.delayed_init import check_rank0_has_weights
from meshtrain_runtime.modules.moe import MoEConfig
from meshtrain_runtime.parallel.blocks import find_blocks
from meshtrain_runtime.parallel.context import COMM_TYPES
from meshtrain_runtime.parallel.context_apply import (
    ContextSettings,
    apply_context_parallel,
    check_context_parallel,
)
from meshtrain_runtime.parallel.tensor import (
    apply_tensor_parallel,
    locally_computed_parameters,
    stop_local_compute,
)
from meshtrain_runtime.parallelize import (
    apply_converters,
    apply_model_parallel,
    check_model_parallel_request,
)

CP_COMM_TYPES = COMM_TYPES  # SMP's "p2p" and "all_gather", and meshtrain's "a2a" (Ulysses)
BLOCK_MARK = "_smp_transformer_layer"


def transform(
    model: nn.Module,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    config: Any = None,
    load_state_dict_from_rank0: bool = False,
    cp_comm_type: str | None = None,
) -> nn.Module:
    """Convert `model` for SMP's layout (TP or EP per ``tsm.init``); wrap it in FSDP next.

    - `config`: a ``tsm.moe.moe_config.MoEConfig`` for expert parallelism (other dicts of SMP
      transformer options are refused: meshtrain keeps the Hugging Face modules).
    - `load_state_dict_from_rank0`: rank 0 holds real weights, other ranks may be on meta; the
      script's FSDP call then needs ``sync_module_states=True`` (as in SMP).
    - `cp_comm_type`: ``"p2p"`` (SMP's default), ``"all_gather"`` or ``"a2a"``; None takes the
      ``cp_comm_type`` parameter. Used when ``context_parallel_degree > 1``: the model then runs
      on the cp rank's chunks (the script splits batches as AWS's ``get_batch_for_cp_rank``
      does); HF ``labels=`` are shifted over the whole sequence (meshtrain_runtime's
      parallel/context_apply.py).
    """
    from meshtrain_runtime.compat.smp._state import state

    if not state._is_initialised():
        raise RuntimeError("tsm.transform() needs tsm.init() first.")
    st = runtime_state.current()
    cp_comm_type = cp_comm_type if cp_comm_type is not None else st.config.cp_comm_type
    moe_config = _check_request(st, config, cp_comm_type, device, load_state_dict_from_rank0)
    context = ContextSettings(st.cp_process_group, st.cp_rank, st.cp_size, cp_comm_type,
                              tp_size=st.tp_size)
    check_context_parallel(model, context)
    if load_state_dict_from_rank0:
        check_rank0_has_weights(model, st.rank, st.device)
    model = apply_converters(model, dtype=dtype)
    blocks = find_blocks(model, None)
    tp_mesh = compat_meshes().tp
    if tp_mesh is not None:  # on SMP's (shard, tp) root, which FSDP1 + TP needs (see _fsdp)
        params = st.config
        model = apply_tensor_parallel(model, tp_mesh, sequence_parallel=params.sequence_parallel,
                                      loss_parallel=params.loss_parallel,
                                      random_seed=params.random_seed)
        _unreplicate_plain_parameters(model)
    else:
        model = apply_model_parallel(model, st, moe_config=moe_config)
    if st.context_parallel_degree > 1:  # before the script's checkpoint wrappers
        apply_context_parallel(model, blocks, context)
    for block in blocks:
        setattr(block, BLOCK_MARK, True)
    if device is not None and not _on_meta(model):
        model.to(torch.device(device))
    return model


def _unreplicate_plain_parameters(model: nn.Module) -> None:
    """Give back plain tensors for the parameters TP left whole (norm weights).

    meshtrain's TP makes them Replicate DTensors so that FSDP2 and AdamW see one kind of tensor;
    FSDP1 flattens plain and DTensor parameters alike (its TP extension unflattens only the
    DTensors) and the optimizer then sees plain shards, so here they go back to plain tensors:
    the same values on every tp rank, updated identically.
    """
    for module in model.modules():
        names = locally_computed_parameters(module)
        if not names:
            continue
        for name in names:
            param = module._parameters[name]
            if isinstance(param, DTensor):
                module.register_parameter(
                    name, nn.Parameter(param.to_local(), requires_grad=param.requires_grad)
                )
        stop_local_compute(module)  # its swap hooks now have nothing to do


def _on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _check_request(
    st: runtime_state.RuntimeState, config: Any, cp_comm_type: str, device: Any, from_rank0: bool
) -> MoEConfig | None:
    """SMP's own arguments, then the checks every transform shares (parallelize's)."""
    if cp_comm_type not in CP_COMM_TYPES:
        raise ConfigError(
            f"tsm.transform(cp_comm_type={cp_comm_type!r}): use 'p2p' (the default), "
            "'all_gather' or 'a2a'."
        )
    if config is not None and not isinstance(config, MoEConfig):
        raise ConfigError(
            f"tsm.transform(config={type(config).__name__}): meshtrain keeps the Hugging Face "
            "modules, so only an MoEConfig (for expert parallelism) is accepted. Drop config= "
            "or pass torch.sagemaker.moe.moe_config.MoEConfig(...)."
        )
    check_model_parallel_request(st, device=device, load_state_dict_from_rank0=from_rank0)
    return config


__all__ = ["BLOCK_MARK", "CP_COMM_TYPES", "transform"]
