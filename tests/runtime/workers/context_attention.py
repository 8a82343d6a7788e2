"""Worker: context-parallel attention on 4 gloo ranks vs single-process SDPA.

Usage (through tests/runtime/conftest.py's run_torchrun, 4 ranks):
    context_attention.py CASE [CASE ...]
CASE is one of
- ``attn/cp{1,2,4}/{p2p,all_gather,a2a}/{causal,full}/{load_balanced,contiguous}/{mha,gqa}``
  (cp2 runs as two groups of 2 ranks, [0, 1] and [2, 3], side by side; cp1 as 4 of 1 rank);
- ``dispatch/cp{2,4}/COMM``: a plain module calling F.scaled_dot_product_attention under
  sdpa_dispatch; ``mask/cp2``: the same with the local causal mask read as is_causal;
- ``refusals/cp2``: ConfigErrors raised on every rank before any communication;
- ``unshard/cp{2,4}/LAYOUT``.
Rank 0 reports, per case, the largest error over all ranks (both cp2 groups included).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from report import report_cases
from torch import nn

from meshtrain_runtime.parallel.context import (
    context_attention,
    context_parallel_shard,
    context_parallel_unshard,
    sdpa_dispatch,
)

BATCH, HEADS, SEQ, HEAD_DIM = 2, 4, 16, 8
_GROUPS: dict[int, tuple[dist.ProcessGroup, int]] = {}


def build_groups() -> None:
    """cp4: the world; cp2: [0, 1] and [2, 3]; cp1: each rank alone (every rank creates
    every group, as new_group needs)."""
    rank = dist.get_rank()
    _GROUPS[1] = ([dist.new_group([r]) for r in range(4)][rank], 0)
    _GROUPS[4] = (dist.new_group([0, 1, 2, 3]), rank)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    _GROUPS[2] = (pairs[rank // 2], rank % 2)


def worst(value: float) -> float:
    """The largest value over every rank (both cp2 groups included)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return worst(float((a.detach() - b.detach()).abs().max()))


def attention_case(cp: int, comm: str, mode: str, layout: str, heads: str) -> dict:
    group, cp_rank = _GROUPS[cp]
    causal, kv_heads = mode == "causal", HEADS // 2 if heads == "gqa" else HEADS
    torch.manual_seed(31)  # the same full tensors on every rank
    q = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, requires_grad=True)
    k = torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, requires_grad=True)
    v = torch.randn(BATCH, kv_heads, SEQ, HEAD_DIM, requires_grad=True)
    grad_out = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads == "gqa")
    grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    full = (q, k, v, grad_out, ref, *grads)
    local, positions = context_parallel_shard(
        *(t.detach() for t in full), seq_dim=2, cp_rank=cp_rank, cp_size=cp, layout=layout)
    lq, lk, lv = (t.clone().requires_grad_() for t in local[:3])
    out = context_attention(lq, lk, lv, group=group, comm_type=comm, is_causal=causal,
                            layout=layout)
    dq, dk, dv = torch.autograd.grad(out, (lq, lk, lv), local[3])
    return {
        "out": max_error(out, local[4]), "dq": max_error(dq, local[5]),
        "dk": max_error(dk, local[6]), "dv": max_error(dv, local[7]),
        "grad_norm": worst(float(local[5].abs().max())), "positions": positions.tolist(),
    }


class TinyAttention(nn.Module):
    """A plain module that calls F.scaled_dot_product_attention (GQA: 4 query, 2 kv heads)."""

    def __init__(self, dim: int = 16, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=True)
        return self.out(a.transpose(1, 2).reshape(b, s, -1))


def dispatch_case(cp: int, comm: str, local_mask: bool = False) -> dict:
    group, cp_rank = _GROUPS[cp]
    torch.manual_seed(7)
    model = TinyAttention()
    x, weight = torch.randn(BATCH, SEQ, 16), torch.randn(BATCH, SEQ, 16)
    ref = model(x)
    (ref * weight).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (lx, lw, lref), _ = context_parallel_shard(x, weight, ref.detach(), seq_dim=1,
                                               cp_rank=cp_rank, cp_size=cp)
    local_seq = SEQ // cp
    mask = torch.ones(local_seq, local_seq, dtype=torch.bool).tril() if local_mask else None
    with sdpa_dispatch(group, comm):
        out = model(lx, mask)
    (out * lw).sum().backward()
    grad_error = 0.0
    for name, param in model.named_parameters():
        dist.all_reduce(param.grad, group=group)  # the cp ranks' shares of one sequence
        grad_error = max(grad_error, float((param.grad - ref_grads[name]).abs().max()))
    local_only = model(lx, mask)  # the same module without the mode: attention within chunks
    return {"out": max_error(out, lref), "grads": worst(grad_error),
            "without_dispatch": max_error(local_only.detach(), lref)}


def unshard_case(cp: int, layout: str) -> dict:
    group, cp_rank = _GROUPS[cp]
    full = torch.arange(3 * SEQ * 2).view(3, SEQ, 2)
    (local,), _ = context_parallel_shard(full, seq_dim=1, cp_rank=cp_rank, cp_size=cp,
                                         layout=layout)
    back = context_parallel_unshard(local, 1, group, layout)
    return {"equal": bool(worst(float(not torch.equal(back, full))) == 0.0)}


def refusals_case() -> dict:
    from meshtrain.contract.errors import ConfigError

    group, _ = _GROUPS[2]
    q = torch.randn(1, 3, 4, 8)
    calls = {
        "a2a_heads": lambda: context_attention(q, q, q, group=group, comm_type="a2a"),
        "attn_mask": lambda: context_attention(q, q, q, group=group,
                                               attn_mask=torch.ones(4, 4, dtype=torch.bool)),
        "dropout": lambda: context_attention(q, q, q, group=group, dropout_p=0.1),
        "comm_type": lambda: context_attention(q, q, q, group=group, comm_type="ring"),
        "odd_local_seq": lambda: context_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3],
                                                   group=group),
        "other_mask": lambda: _dispatch_with(group, torch.zeros(4, 4, dtype=torch.bool)),
    }
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except ConfigError as error:
            messages[name] = str(error)
    return {"messages": messages}


def _dispatch_with(group: dist.ProcessGroup, mask: torch.Tensor) -> torch.Tensor:
    q = torch.randn(1, 2, 4, 8)
    with sdpa_dispatch(group):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def run(case: str) -> dict:
    kind, cp, *rest = case.split("/")
    cp_size = int(cp.removeprefix("cp"))
    if kind == "attn":
        return attention_case(cp_size, *rest)
    if kind == "dispatch":
        return dispatch_case(cp_size, rest[0])
    if kind == "mask":
        return dispatch_case(cp_size, "p2p", local_mask=True)
    if kind == "unshard":
        return unshard_case(cp_size, rest[0])
    return refusals_case()


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    build_groups()
    report_cases((case, lambda case=case: run(case)) for case in sys.argv[1:])


if __name__ == "__main__":
    main()
