"""``torch.sagemaker.grad_norm.clip_grad_norm_`` for the script's FSDP1 / FSDP2 model.

FSDP1 without tensor parallelism: FSDP's own ``clip_grad_norm_``. FSDP1 with tensor parallelism
(torch's FSDP1 + TP recipe, SMP's flow): FSDP1 flattens the TP shards into its flat parameters as
plain local tensors, but each flat parameter remembers, per original parameter, the DTensor spec
it came from (``_param_extensions``) and where its elements sit in this rank's shard
(``_shard_param_infos``). The gradient elements of parameters split over ``tp`` are summed over
the FSDP group and the tp group; those of parameters every tp rank holds whole (norm weights)
over the FSDP group only, so nothing is counted twice. FSDP2 / DTensor models use meshtrain's
``clip_grad_norm_``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import grad
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.compat.smp import _fsdp1_ep as fsdp1_ep
from meshtrain_runtime.torch_api import flat_param_layout, fsdp1_handle


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip gradients to `max_norm` (total norm over every shard); return the total norm."""
    if isinstance(model, FullyShardedDataParallel):
        st = runtime_state.current() if runtime_state.is_initialized() else None
        if st is not None and st.expert_parallel_degree > 1:  # FSDP1 over the experts' dp group
            return fsdp1_ep.clip_grad_norm_(model, st.ep_process_group, float(max_norm),
                                            float(norm_type))
        tp = st.tensor_parallel_degree if st is not None else 1
        if tp == 1:
            return model.clip_grad_norm_(max_norm, norm_type)
        return _clip_fsdp1_tp(model, float(max_norm), float(norm_type))
    return grad.clip_grad_norm_(model, max_norm, norm_type=norm_type)


def _split_over_tp(extension: object) -> bool:
    """True when the original parameter was a DTensor sharded on some mesh axis."""
    placements = getattr(extension, "placements", ())
    return any(p.is_shard() for p in placements)


def _grad_pieces(model: FullyShardedDataParallel) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """This rank's gradient elements, as (split over tp, held whole by every tp rank)."""
    split: list[torch.Tensor] = []
    whole: list[torch.Tensor] = []
    seen: set[int] = set()
    for module in FullyShardedDataParallel.fsdp_modules(model):
        handle = fsdp1_handle(module)
        if handle is None or id(handle.flat_param) in seen:
            continue
        flat = handle.flat_param
        seen.add(id(flat))
        if flat.grad is None:
            continue
        layout = flat_param_layout(flat)
        for info, extension in zip(layout.shard_param_infos, layout.param_extensions,
                                   strict=True):
            if not info.in_shard or not info.numel_in_shard:
                continue
            piece = flat.grad.detach()[info.offset_in_shard:info.offset_in_shard
                                       + info.numel_in_shard]
            (split if _split_over_tp(extension) else whole).append(piece)
    return split, whole


def _local_norm_term(pieces: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """sum(|g|^p) (or max |g| for p = inf) over `pieces`, in float32."""
    if not pieces:
        return torch.zeros((), dtype=torch.float32)
    flat = torch.cat([p.float().reshape(-1) for p in pieces])
    if math.isinf(norm_type):
        return flat.abs().max()
    return flat.abs().pow(norm_type).sum()


def _clip_fsdp1_tp(model: FullyShardedDataParallel, max_norm: float,
                   norm_type: float) -> torch.Tensor:
    if norm_type <= 0:
        raise ConfigError(f"clip_grad_norm_(norm_type={norm_type}): use a positive norm or inf.")
    split, whole = _grad_pieces(model)
    op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
    split_term = _local_norm_term(split, norm_type).to(runtime_state.current().device)
    whole_term = _local_norm_term(whole, norm_type).to(split_term.device)
    dist.all_reduce(split_term, op=op, group=model.process_group)
    dist.all_reduce(split_term, op=op, group=runtime_state.current().tp_process_group)
    dist.all_reduce(whole_term, op=op, group=model.process_group)
    if math.isinf(norm_type):
        total = torch.maximum(split_term, whole_term)
    else:
        total = (split_term + whole_term).pow(1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for piece in [*split, *whole]:
        piece.mul_(coef.to(piece.dtype))
    return total


__all__ = ["clip_grad_norm_"]
