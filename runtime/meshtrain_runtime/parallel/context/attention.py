"""context_attention: exact attention over a sequence split across a context-parallel group."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.context.layout import Layout, check_layout, chunk_ids
from meshtrain_runtime.parallel.context.ring import AllGatherAttention, CpGeometry, RingAttention
from meshtrain_runtime.parallel.context.ulysses import ulysses_attention

COMM_TYPES = ("p2p", "all_gather", "a2a")


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ConfigError(
            f"context_attention takes (batch, heads, local_seq, head_dim) tensors; got q, k, v "
            f"of {q.dim()}, {k.dim()}, {v.dim()} dims."
        )
    if k.shape[2] != q.shape[2] or v.shape[2] != q.shape[2]:
        raise ConfigError(
            f"q, k, v hold {q.shape[2]}, {k.shape[2]}, {v.shape[2]} local tokens; context "
            f"parallel attention needs the same local chunks for all three (no KV cache)."
        )
    if k.shape[:2] != v.shape[:2] or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"q heads {q.shape[1]} must be a multiple of k/v heads {k.shape[1]} (GQA) with the "
            f"same batch; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}."
        )


def _check_options(comm_type: str, layout: str, q: torch.Tensor, cp: int) -> None:
    if comm_type not in COMM_TYPES:
        raise ConfigError(f"cp_comm_type={comm_type!r} is not one of {COMM_TYPES}.")
    check_layout(layout)
    per_rank = len(chunk_ids(0, cp, layout))
    if q.shape[2] % per_rank:
        raise ConfigError(
            f"a local sequence of {q.shape[2]} tokens cannot hold the {per_rank} equal chunks "
            f"each rank has in the {layout!r} layout ({q.shape[2]} % {per_rank} = "
            f"{q.shape[2] % per_rank}); shard with context_parallel_shard."
        )
    if comm_type == "a2a" and q.shape[1] % cp:
        raise ConfigError(
            f"cp_comm_type='a2a' (Ulysses) scatters attention heads over the cp group: "
            f"{q.shape[1]} heads are not divisible by context_parallel_degree={cp} "
            f"({q.shape[1]} % {cp} = {q.shape[1] % cp}). Use 'p2p' or 'all_gather', or a cp "
            f"degree that divides {q.shape[1]}."
        )


def context_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: dist.ProcessGroup,
    comm_type: str = "p2p", is_causal: bool = True, scale: float | None = None,
    layout: Layout = "load_balanced", attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Exact attention of this rank's local chunks over the whole sequence of the cp `group`.

    q (batch, heads, local_seq, head_dim) and k, v (batch, kv_heads, local_seq, head_dim) are
    this rank's chunks in `layout` (see context_parallel_shard); kv_heads may divide heads
    (GQA, repeated as SDPA's enable_gqa). Returns the local output (batch, heads, local_seq,
    v_dim): the slice of scaled_dot_product_attention over the full sequence that belongs to
    this rank, causal over global positions when `is_causal`. Differentiable in q, k, v.

    comm_type: "p2p" (ring: key/value blocks passed around the group, cp - 1 hops),
    "all_gather" (all key/value blocks gathered at once) or "a2a" (Ulysses: all-to-all of
    heads; heads must be divisible by cp). `attn_mask` other than None and `dropout_p` > 0 are
    refused with ConfigError: an arbitrary mask is defined over the full sequence, which no
    rank holds, and dropout's random pattern would not match a single process's.
    """
    cp = dist.get_world_size(group)
    _check_shapes(q, k, v)
    _check_options(comm_type, layout, q, cp)
    if attn_mask is not None:
        raise ConfigError(
            "context parallel attention takes no attn_mask: a mask spans the whole sequence, "
            "which no rank holds. Pass is_causal=True (causal) or False (full attention); for "
            "padding, mark padded targets -100 so they are ignored by the loss."
        )
    if dropout_p:
        raise ConfigError(
            f"context parallel attention does not implement attention dropout (dropout_p="
            f"{dropout_p}); set attention_dropout=0.0 (the usual value for LLM pre-training)."
        )
    geo = CpGeometry(group, dist.get_rank(group), cp, layout, bool(is_causal),
                     scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if comm_type == "a2a":
        return ulysses_attention(q, k, v, geo)
    function = RingAttention if comm_type == "p2p" else AllGatherAttention
    return function.apply(q, k, v, geo)
