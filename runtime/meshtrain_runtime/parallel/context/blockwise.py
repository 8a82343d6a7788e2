"""Exact attention of local queries against one block of keys at a time, and the merge.

The forward of one (query rows, key block) pair returns the block's normalised output and the
logsumexp (lse) of its scores per query row; blocks merge exactly by their lse (the online
softmax of FlashAttention / ring attention). The backward of a block needs only the final
output's lse and delta = rowsum(dO * O), so each block's gradients are computed on their own.

GQA without copies: q (B, H, Sq, D) is viewed per key/value head as (B, Hkv, R x Sq, D) with
R = H / Hkv (query head h uses key/value head h // R, as SDPA's enable_gqa), so one matmul
against k (B, Hkv, Sk, D) serves all R query heads and the key gradient sums over them.

Causal work is skipped a chunk at a time: local tokens are in increasing global order, so the
keys a query chunk can see are a prefix of the key block, and only a chunk on the diagonal
needs an element mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Block:
    """One unit of work: query rows [q_start, q_end) against the first `n_keys` keys."""

    q_start: int
    q_end: int
    n_keys: int
    mask: torch.Tensor | None  # (q_end - q_start, n_keys) bool, True = attend; None = all


def plan_blocks(
    pos_q: torch.Tensor, pos_k: torch.Tensor, q_chunk: int, causal: bool,
    device: torch.device | None = None,
) -> list[Block]:
    """The blocks of local queries (global positions `pos_q`, chunks of `q_chunk` rows)
    against a key block at global positions `pos_k`; empty blocks are left out. Positions
    are planned on the CPU; a mask is put on `device`."""
    pos_q, pos_k = pos_q.cpu(), pos_k.cpu()
    blocks = []
    for start in range(0, pos_q.numel(), q_chunk):
        rows = pos_q[start:start + q_chunk]
        if not causal:
            blocks.append(Block(start, start + rows.numel(), pos_k.numel(), None))
            continue
        n_keys = int(torch.searchsorted(pos_k, rows.max(), right=True))
        if n_keys == 0:
            continue
        mask = None
        if int(pos_k[n_keys - 1]) > int(rows.min()):  # some key lies after some query
            mask = (pos_k[None, :n_keys] <= rows[:, None]).to(device)
        blocks.append(Block(start, start + rows.numel(), n_keys, mask))
    return blocks


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmax statistics and sums are kept in: float32, or float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _grouped(x: torch.Tensor, start: int, end: int, kv_heads: int) -> torch.Tensor:
    """Rows [start, end) of a query-shaped (B, H, S, E) tensor as (B, Hkv, R x rows, E)."""
    b, h, _, e = x.shape
    return x[:, :, start:end].reshape(b, kv_heads, (h // kv_heads) * (end - start), e)


def _ungrouped(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hkv, R x rows, E) back to (B, H, rows, E)."""
    b, _, n, e = x.shape
    return x.reshape(b, heads, n * x.shape[1] // heads, e)


def _probabilities(
    q: torch.Tensor, k: torch.Tensor, block: Block, scale: float, lse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of grouped queries against the key prefix, masked; and exp(scores - lse) where
    `lse` is given, else the block's own lse with its normalised probabilities."""
    keys = k[:, :, :block.n_keys]
    scores = torch.matmul(q, keys.transpose(-1, -2)).to(_wide(q.dtype)) * scale
    if block.mask is not None:
        repeat = q.shape[2] // block.mask.shape[0]
        scores = scores.masked_fill(~block.mask.repeat(repeat, 1), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows that see nothing
    return torch.exp(scores - safe[..., None]), lse


def forward_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Block, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's output (B, H, rows, Dv) and its lse (B, H, rows)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    grouped = _grouped(q, block.q_start, block.q_end, kv_heads)
    probs, lse = _probabilities(grouped, k, block, scale, None)
    out = torch.matmul(probs.to(v.dtype), v[:, :, :block.n_keys]).to(_wide(q.dtype))
    rows = block.q_end - block.q_start
    return _ungrouped(out, heads), lse.reshape(lse.shape[0], heads, rows)


class Accumulator:
    """The running output and lse of local queries, merged block by block (wide)."""

    def __init__(self, q: torch.Tensor, v_dim: int) -> None:
        b, h, s, _ = q.shape
        self.out = torch.zeros(b, h, s, v_dim, dtype=_wide(q.dtype), device=q.device)
        self.lse = torch.full((b, h, s), float("-inf"), dtype=_wide(q.dtype), device=q.device)

    def add(self, block: Block, out: torch.Tensor, lse: torch.Tensor) -> None:
        """Merge one block's (output, lse) into rows [q_start, q_end)."""
        rows = slice(block.q_start, block.q_end)
        old_lse = self.lse[:, :, rows]
        new_lse = torch.logaddexp(old_lse, lse)
        safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
        old_w = torch.exp(old_lse - safe)[..., None]
        new_w = torch.exp(lse - safe)[..., None]
        self.out[:, :, rows] = self.out[:, :, rows] * old_w + out * new_w
        self.lse[:, :, rows] = new_lse

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: list[Block], scale: float
    ) -> None:
        """Merge every block of `blocks` (queries `q` against this key/value block)."""
        for block in blocks:
            self.add(block, *forward_block(q, k, v, block, scale))


def backward_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
    stats: tuple[torch.Tensor, torch.Tensor], blocks: list[Block], scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of q (wide, all local rows) and of this key/value block from `blocks`.

    `stats` is the final (lse, delta) per query row, delta = rowsum(dO * O), both wide
    (float32, or float64 for float64 inputs).
    """
    lse, delta = stats
    wide = _wide(q.dtype)
    heads, kv_heads = q.shape[1], k.shape[1]
    dq = torch.zeros(q.shape, dtype=wide, device=q.device)
    dk = torch.zeros(k.shape, dtype=wide, device=k.device)
    dv = torch.zeros(v.shape, dtype=wide, device=v.device)
    for block in blocks:
        start, end, n = block.q_start, block.q_end, block.n_keys
        grouped = _grouped(q, start, end, kv_heads)
        row_lse = _grouped(lse[..., None], start, end, kv_heads)[..., 0]
        row_delta = _grouped(delta[..., None], start, end, kv_heads)[..., 0]
        d_out = _grouped(grad_out, start, end, kv_heads)
        probs, _ = _probabilities(grouped, k, block, scale, row_lse)
        dv[:, :, :n] += torch.matmul(probs.transpose(-1, -2).to(v.dtype), d_out).to(wide)
        d_probs = torch.matmul(d_out, v[:, :, :n].transpose(-1, -2)).to(wide)
        d_scores = (probs * (d_probs - row_delta[..., None]) * scale).to(q.dtype)
        dq[:, :, start:end] += _ungrouped(torch.matmul(d_scores, k[:, :, :n]).to(wide), heads)
        dk[:, :, :n] += torch.matmul(d_scores.transpose(-1, -2), grouped).to(wide)
    return dq, dk, dv
