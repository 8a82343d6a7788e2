"""Ring attention ("p2p") and all-gather attention over a cp group: exact, with custom backward.

p2p: each rank starts with its own key/value block and passes it to the next rank cp - 1
times, computing its queries against the block it holds while the next one is in flight; the
blocks merge by logsumexp. The backward passes the blocks around again, with a running key/value
gradient that travels with each block and is home (at its owner) after cp hops.

all_gather: every rank gathers all key/value blocks at once (one collective, cp x the memory of
one block) and attends to them; the backward gathers them again (nothing gathered is kept
between forward and backward) and returns each block's gradient to its owner by a
reduce-scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshtrain_runtime.parallel.context.blockwise import (
    Accumulator,
    Block,
    backward_blocks,
    plan_blocks,
)
from meshtrain_runtime.parallel.context.comms import (
    GRAD_TAG,
    KV_TAG,
    RingExchange,
    all_gather_rows,
    pack,
    reduce_scatter_rows,
    unpack,
)
from meshtrain_runtime.parallel.context.layout import chunk_ids, local_positions


@dataclass(frozen=True)
class CpGeometry:
    """Who holds what: the cp group, this rank, the layout and the attention options."""

    group: dist.ProcessGroup
    rank: int
    size: int
    layout: str
    causal: bool
    scale: float

    def blocks(self, q: torch.Tensor, src: int) -> list[Block]:
        """The blocks of this rank's queries against cp rank `src`'s keys."""
        local_seq = q.shape[2]
        pos_q = local_positions(local_seq, self.rank, self.size, self.layout)
        pos_k = local_positions(local_seq, src, self.size, self.layout)
        q_chunk = local_seq // len(chunk_ids(self.rank, self.size, self.layout))
        return plan_blocks(pos_q, pos_k, q_chunk, self.causal, q.device)


class RingAttention(torch.autograd.Function):
    """p2p ring attention; inputs are local (B, H, S_local, D) q and (B, Hkv, S_local, D) k, v."""

    @staticmethod
    def forward(ctx, q, k, v, geo: CpGeometry):
        acc = Accumulator(q, v.shape[-1])
        buffer = pack(k, v)
        for step in range(geo.size):
            exchange = RingExchange(buffer, geo.group, KV_TAG) if step + 1 < geo.size else None
            kk, vv = unpack(buffer, k, v)
            acc.attend(q, kk, vv, geo.blocks(q, (geo.rank - step) % geo.size), geo.scale)
            if exchange is not None:
                buffer = exchange.wait()
        out = acc.out.to(q.dtype)
        ctx.geo = geo
        ctx.save_for_backward(q, k, v, out, acc.lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        geo: CpGeometry = ctx.geo
        grad_out = grad_out.to(q.dtype)
        dq_total = torch.zeros(q.shape, dtype=lse.dtype, device=q.device)
        buffer, pending = pack(k, v), None
        for step in range(geo.size):
            exchange = RingExchange(buffer, geo.group, KV_TAG) if step + 1 < geo.size else None
            kk, vv = unpack(buffer, k, v)
            blocks = geo.blocks(q, (geo.rank - step) % geo.size)
            dq, dk, dv = backward_blocks(q, kk, vv, grad_out, (out, lse), blocks, geo.scale)
            dq_total += dq
            grads = pack(dk, dv) if pending is None else pending.wait() + pack(dk, dv)
            if geo.size > 1:  # to the block's next holder; after cp hops, to its owner
                pending = RingExchange(grads, geo.group, GRAD_TAG)
            if exchange is not None:
                buffer = exchange.wait()
        dk, dv = unpack(grads if pending is None else pending.wait(), k, v)
        return dq_total.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


class AllGatherAttention(torch.autograd.Function):
    """all_gather attention; same inputs and result as RingAttention."""

    @staticmethod
    def forward(ctx, q, k, v, geo: CpGeometry):
        acc = Accumulator(q, v.shape[-1])
        rows = all_gather_rows(pack(k, v), geo.group)
        for src in range(geo.size):
            kk, vv = unpack(rows[src], k, v)
            acc.attend(q, kk, vv, geo.blocks(q, src), geo.scale)
        out = acc.out.to(q.dtype)
        ctx.geo = geo
        ctx.save_for_backward(q, k, v, out, acc.lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        geo: CpGeometry = ctx.geo
        grad_out = grad_out.to(q.dtype)
        rows = all_gather_rows(pack(k, v), geo.group)
        dq_total = torch.zeros(q.shape, dtype=lse.dtype, device=q.device)
        grads = []
        for src in range(geo.size):
            kk, vv = unpack(rows[src], k, v)
            blocks = geo.blocks(q, src)
            dq, dk, dv = backward_blocks(q, kk, vv, grad_out, (out, lse), blocks, geo.scale)
            dq_total += dq
            grads.append(pack(dk, dv))
        dk, dv = unpack(reduce_scatter_rows(torch.stack(grads), geo.group), k, v)
        return dq_total.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None
