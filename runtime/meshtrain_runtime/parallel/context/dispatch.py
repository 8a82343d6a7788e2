"""sdpa_dispatch: run every F.scaled_dot_product_attention call as context_attention.

A TorchFunctionMode, as torch's experimental context_parallel intercepts SDPA: a model written
for one process (an HF model with attn_implementation="sdpa", a plain module) runs on local
chunks unchanged, its attention exact over the whole sequence.

Masks: HF transformers 5.x's sdpa path passes attn_mask=None with is_causal=True for
decoder-only models (Llama, Mistral, Qwen2, GPT-NeoX) when no padding mask is given, also with
global position_ids. A mask that is exactly causal over the local tokens (what a model unaware
of the split builds for its local sequence: bool True on and below the diagonal, or additive 0
there and -inf / the dtype's minimum above) is read as is_causal=True; any other mask is
refused with ConfigError, since it would be over local tokens only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.context.attention import context_attention
from meshtrain_runtime.parallel.context.layout import Layout

_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def is_local_causal_mask(mask: torch.Tensor, seq: int) -> bool:
    """Whether `mask` (broadcastable to (..., seq, seq)) is exactly causal over `seq` tokens."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (seq, seq):
        return False
    causal = torch.ones(seq, seq, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return bool((mask == causal).all())
    if not mask.is_floating_point():
        return False
    kept = mask.masked_select(causal.expand_as(mask))
    dropped = mask.masked_select(~causal.expand_as(mask))
    floor = torch.finfo(mask.dtype).min
    return bool((kept == 0).all()) and bool(((dropped == float("-inf")) | (dropped <= floor)).all())


class _ContextSdpa(TorchFunctionMode):
    def __init__(self, group: dist.ProcessGroup, comm_type: str, layout: Layout) -> None:
        super().__init__()
        self.group, self.comm_type, self.layout = group, comm_type, layout

    def __torch_function__(
        self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        call = {**dict(zip(_SDPA_ARGS, args, strict=False)), **kwargs}
        q, k, v = call["query"], call["key"], call["value"]
        mask, is_causal = call.get("attn_mask"), bool(call.get("is_causal", False))
        if mask is not None and is_local_causal_mask(mask, q.shape[-2]):
            mask, is_causal = None, True
        if k.shape[1] != q.shape[1] and not call.get("enable_gqa", False):
            raise ConfigError(
                f"scaled_dot_product_attention got {q.shape[1]} query heads and {k.shape[1]} "
                f"key/value heads without enable_gqa=True; SDPA itself refuses this call."
            )
        return context_attention(
            q, k, v, group=self.group, comm_type=self.comm_type, is_causal=is_causal,
            scale=call.get("scale"), layout=self.layout, attn_mask=mask,
            dropout_p=call.get("dropout_p", 0.0),
        )


def sdpa_dispatch(
    group: dist.ProcessGroup, comm_type: str = "p2p", layout: Layout = "load_balanced"
) -> TorchFunctionMode:
    """A context manager under which F.scaled_dot_product_attention(q, k, v, ...) on local
    chunks runs as context_attention over the cp `group` (is_causal, scale, enable_gqa kept).

    ``with sdpa_dispatch(group, "p2p"): loss = model(local_ids, position_ids=positions)...``
    Refuses (ConfigError) dropout_p > 0 and any attn_mask that is not exactly causal over the
    local tokens (that one is read as is_causal=True). The backward may run outside the mode.
    """
    return _ContextSdpa(group, comm_type, layout)
