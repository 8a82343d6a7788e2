"""Exact attention of local queries against one block of keys at a time, and the merge.

The forward of one (query rows, key rows) block returns the block's normalised output and the
logsumexp (lse) of its scores per query row; blocks merge exactly by their lse (the online
softmax of FlashAttention / ring attention). The backward of a block needs only the final
output and its lse (delta = rowsum(dO * O)), so each block's gradients are computed on their own.

Blocks are pairs of equal chunks of the layout (see layout.py): under a causal mask a key chunk
is wholly visible (before the query chunk), causal within (the same chunk: the diagonal) or
skipped (after it). So every block is a plain SDPA problem, full or top-left causal. On the CPU
it runs through torch's fused flash kernel, which returns the lse
(aten::_scaled_dot_product_flash_attention_for_cpu and its backward, the kernels SDPA itself
uses on the CPU); elsewhere through the matmul math below, in which GQA needs no copies: q
(B, H, Sq, D) is viewed per key/value head as (B, Hkv, R x Sq, D) with R = H / Hkv (query head
h uses key/value head h // R, as SDPA's enable_gqa).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from meshtrain_runtime.torch_api import flash_attention_cpu, flash_attention_cpu_backward


@dataclass(frozen=True)
class Block:
    """Query rows [q_start, q_end) against key rows [k_start, k_end): all of them, causal
    within (the same chunk of the sequence, square), or under an explicit `mask`."""

    q_start: int
    q_end: int
    k_start: int
    k_end: int
    causal: bool = False
    mask: torch.Tensor | None = None  # (rows, keys) bool, True = attend

    def element_mask(self, device: torch.device) -> torch.Tensor | None:
        """The (rows, keys) mask of the math path; None when every key is seen."""
        if self.causal:
            rows = self.q_end - self.q_start
            return torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
        return self.mask


def plan_blocks(
    pos_q: torch.Tensor, pos_k: torch.Tensor, chunk: int, causal: bool,
    device: torch.device | None = None,
) -> list[Block]:
    """The blocks of local queries (global positions `pos_q`) against a key block (global
    positions `pos_k`), both cut into chunks of `chunk` rows; empty blocks are left out and
    adjacent wholly visible key chunks are joined. Planned on the CPU; a mask goes to `device`."""
    pos_q, pos_k = pos_q.cpu(), pos_k.cpu()
    blocks: list[Block] = []
    for q_start in range(0, pos_q.numel(), chunk):
        rows = pos_q[q_start:q_start + chunk]
        q_end = q_start + rows.numel()
        if not causal:
            blocks.append(Block(q_start, q_end, 0, pos_k.numel()))
            continue
        for k_start in range(0, pos_k.numel(), chunk):
            keys = pos_k[k_start:k_start + chunk]
            k_end = k_start + keys.numel()
            if int(keys.min()) > int(rows.max()):
                continue  # wholly after the queries
            if int(keys.max()) <= int(rows.min()):
                last = blocks[-1] if blocks else None
                if last and last.q_start == q_start and last.k_end == k_start and not (
                        last.causal or last.mask is not None):
                    blocks[-1] = Block(q_start, q_end, last.k_start, k_end)
                else:
                    blocks.append(Block(q_start, q_end, k_start, k_end))
            elif torch.equal(keys, rows):
                blocks.append(Block(q_start, q_end, k_start, k_end, causal=True))
            else:  # chunks that overlap in part: not made by this package's layouts
                mask = (keys[None, :] <= rows[:, None]).to(device)
                blocks.append(Block(q_start, q_end, k_start, k_end, mask=mask))
    return blocks


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmax statistics and sums are kept in: float32, or float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _fused(q: torch.Tensor, block: Block) -> bool:
    return q.device.type == "cpu" and block.mask is None


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
    """Scores of grouped queries against the block's keys, masked; and exp(scores - lse)
    where `lse` is given, else the block's own lse with its normalised probabilities."""
    keys = k[:, :, block.k_start:block.k_end]
    scores = torch.matmul(q, keys.transpose(-1, -2)).to(_wide(q.dtype)) * scale
    mask = block.element_mask(q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(q.shape[2] // mask.shape[0], 1), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows that see nothing
    return torch.exp(scores - safe[..., None]), lse


def forward_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Block, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's output (B, H, rows, Dv) and its lse (B, H, rows), both wide."""
    wide, keys = _wide(q.dtype), slice(block.k_start, block.k_end)
    if _fused(q, block):
        out, lse = flash_attention_cpu(q[:, :, block.q_start:block.q_end], k[:, :, keys],
                                       v[:, :, keys], 0.0, block.causal, scale=scale)
        return out.to(wide), lse.to(wide)
    heads, kv_heads = q.shape[1], k.shape[1]
    grouped = _grouped(q, block.q_start, block.q_end, kv_heads)
    probs, lse = _probabilities(grouped, k, block, scale, None)
    out = torch.matmul(probs.to(v.dtype), v[:, :, keys]).to(wide)
    return _ungrouped(out, heads), lse.reshape(lse.shape[0], heads, block.q_end - block.q_start)


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


def _math_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
    stats: tuple[torch.Tensor, torch.Tensor], block: Block, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's (dq rows, dk rows, dv rows) by the matmul math; `stats` = (lse, delta)."""
    start, end, keys = block.q_start, block.q_end, slice(block.k_start, block.k_end)
    heads, kv_heads, wide = q.shape[1], k.shape[1], _wide(q.dtype)
    grouped = _grouped(q, start, end, kv_heads)
    row_lse, row_delta = (_grouped(t[..., None], start, end, kv_heads)[..., 0] for t in stats)
    d_out = _grouped(grad_out, start, end, kv_heads)
    probs, _ = _probabilities(grouped, k, block, scale, row_lse)
    dv = torch.matmul(probs.transpose(-1, -2).to(v.dtype), d_out).to(wide)
    d_probs = torch.matmul(d_out, v[:, :, keys].transpose(-1, -2)).to(wide)
    d_scores = (probs * (d_probs - row_delta[..., None]) * scale).to(q.dtype)
    dq = _ungrouped(torch.matmul(d_scores, k[:, :, keys]).to(wide), heads)
    dk = torch.matmul(d_scores.transpose(-1, -2), grouped).to(wide)
    return dq, dk, dv


def backward_blocks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
    final: tuple[torch.Tensor, torch.Tensor], blocks: list[Block], scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (wide) of q (all local rows) and of this key/value block from `blocks`.

    `final` is the whole attention's (output in q's dtype, lse in the wide dtype) per query row.
    """
    out, lse = final
    wide, delta = _wide(q.dtype), None
    dq = torch.zeros(q.shape, dtype=wide, device=q.device)
    dk = torch.zeros(k.shape, dtype=wide, device=k.device)
    dv = torch.zeros(v.shape, dtype=wide, device=v.device)
    for block in blocks:
        rows, keys = slice(block.q_start, block.q_end), slice(block.k_start, block.k_end)
        if _fused(q, block):
            grads = flash_attention_cpu_backward(
                grad_out[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys],
                out[:, :, rows], lse[:, :, rows].contiguous(), 0.0, block.causal, scale=scale)
        else:
            if delta is None:
                delta = (grad_out.to(wide) * out.to(wide)).sum(dim=-1)
            grads = _math_backward(q, k, v, grad_out, (lse, delta), block, scale)
        dq[:, :, rows] += grads[0]
        dk[:, :, keys] += grads[1]
        dv[:, :, keys] += grads[2]
    return dq, dk, dv
