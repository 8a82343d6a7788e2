"""Ulysses attention ("a2a"): heads scattered, sequence gathered, by all-to-all (DeepSpeed).

Each rank sends head group j of its local chunks to cp rank j and receives its own head group
over the whole sequence; the sequence is put in global order, attention runs locally on
heads / cp heads with SDPA itself, and a second all-to-all brings the output back to the local
chunks with all heads. Differentiable end to end (the all-to-all's gradient is the reverse
all-to-all), so autograd gives exact gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from meshtrain_runtime.parallel.context.comms import all_to_all
from meshtrain_runtime.parallel.context.layout import local_positions
from meshtrain_runtime.parallel.context.ring import CpGeometry


def _global_order(local_seq: int, geo: CpGeometry, device: torch.device) -> torch.Tensor:
    """Index that sorts the rank-ordered gathered sequence into global positions."""
    positions = torch.cat([
        local_positions(local_seq, rank, geo.size, geo.layout) for rank in range(geo.size)
    ])
    return torch.argsort(positions).to(device)


def _heads_to_sequence(x: torch.Tensor, geo: CpGeometry, order: torch.Tensor) -> torch.Tensor:
    """(B, H, S_local, E) -> this rank's head group over the whole sequence (B, H/cp, S, E)."""
    b, h, s, e = x.shape
    parts = x.reshape(b, geo.size, h // geo.size, s, e).movedim(1, 0)
    gathered = all_to_all(parts, geo.group)  # slice i: cp rank i's chunks, my heads
    sequence = gathered.movedim(0, 2).reshape(b, h // geo.size, geo.size * s, e)
    return sequence.index_select(2, order)


def _sequence_to_heads(x: torch.Tensor, geo: CpGeometry, inverse: torch.Tensor) -> torch.Tensor:
    """(B, H/cp, S, E) in global order -> this rank's chunks with all heads (B, H, S_local, E)."""
    b, hg, s, e = x.shape
    rank_order = x.index_select(2, inverse).reshape(b, hg, geo.size, s // geo.size, e)
    returned = all_to_all(rank_order.movedim(2, 0), geo.group)  # slice j: head group j
    return returned.movedim(0, 1).reshape(b, geo.size * hg, s // geo.size, e)


def ulysses_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, geo: CpGeometry
) -> torch.Tensor:
    """Exact attention of local chunks by all-to-all; q's heads divisible by cp (checked by the
    caller). Key/value heads not divisible by cp are repeated to q's heads first."""
    if k.shape[1] % geo.size:
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    order = _global_order(q.shape[2], geo, q.device)
    inverse = torch.argsort(order)
    q_all, k_all, v_all = (_heads_to_sequence(t, geo, order) for t in (q, k, v))
    out = F.scaled_dot_product_attention(
        q_all, k_all, v_all, is_causal=geo.causal, scale=geo.scale,
        enable_gqa=k_all.shape[1] != q_all.shape[1],
    )
    return _sequence_to_heads(out, geo, inverse)
