"""``torch.sagemaker.grad_norm.clip_grad_norm_`` for the script's FSDP1 / FSDP2 model."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import grad
from meshtrain_runtime import state as runtime_state


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """Clip gradients to `max_norm` (total norm over every shard); return the total norm.

    FSDP1: FSDP's own ``clip_grad_norm_`` (sums over the sharding group). Under tensor
    parallelism FSDP1 holds the TP shards as plain local tensors, so it cannot tell split from
    replicated gradients: that case raises. FSDP2 / DTensor models use meshtrain's
    ``clip_grad_norm_``, which knows every layout.
    """
    if isinstance(model, FullyShardedDataParallel):
        tp = runtime_state.current().tensor_parallel_degree if runtime_state.is_initialized() else 1
        if tp > 1:
            raise ConfigError(
                f"tsm.grad_norm.clip_grad_norm_ on an FSDP1 model with tensor_parallel_degree={tp} "
                "is not supported: FSDP1 flattens the tensor-parallel shards into local tensors, "
                "so the split and replicated gradients cannot be told apart. Use FSDP2 "
                "(fully_shard) or meshtrain_runtime.transform, or clip without tensor parallelism."
            )
        return model.clip_grad_norm_(max_norm, norm_type)
    return grad.clip_grad_norm_(model, max_norm, norm_type=norm_type)


__all__ = ["clip_grad_norm_"]
