"""Tensor parallelism x expert parallelism: tokens split over the tp ranks before dispatch.

With tensor parallelism (no sequence parallelism) every tp rank holds the same tokens when they
reach a MoE layer. Dispatching them from every tp rank would route each token ``tp`` times, so
(as Megatron-Core does with sequence parallelism) each tp rank takes its own contiguous share of
the rows before the all-to-all and the results are gathered back over tp afterwards:

* `scatter_rows`: forward keeps this rank's rows; backward all-gathers the row gradients (the
  input is replicated over tp, so every tp rank needs the gradient of every row);
* `gather_rows`: forward all-gathers every tp rank's rows; backward keeps this rank's rows (the
  output is replicated over tp: every tp rank holds the same gradient, so no sum).

The router runs before the split, on all rows (the same on every tp rank), so its weight gets
the same gradient on every tp rank, as every other replicated parameter under TP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from meshtrain_runtime.parallel.collectives import all_gather_into


@dataclass(frozen=True)
class TokenSplit:
    """The tp group the rows of a MoE layer's input are split over (``size`` ranks)."""

    group: Any
    size: int
    rank: int

    def bounds(self, total: int, rank: int | None = None) -> tuple[int, int]:
        """[start, stop) of `rank`'s rows out of `total` (contiguous, ceil-sized shares)."""
        chunk = -(-total // self.size)
        rank = self.rank if rank is None else rank
        return min(rank * chunk, total), min((rank + 1) * chunk, total)


def _all_gather_rows(local: torch.Tensor, split: TokenSplit, total: int) -> torch.Tensor:
    """Every tp rank's rows, in rank order (shares padded to one size for the collective)."""
    chunk = -(-total // split.size)
    padded = local.new_zeros((chunk, *local.shape[1:]))
    padded[: local.shape[0]] = local
    gathered = padded.new_empty((split.size * chunk, *local.shape[1:]))
    all_gather_into(gathered, padded, group=split.group)
    parts = gathered.split(chunk)
    rows = [part[: stop - start] for part, (start, stop) in
            ((p, split.bounds(total, r)) for r, p in enumerate(parts))]
    return torch.cat(rows, dim=0)


class _ScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, full: torch.Tensor, split: TokenSplit) -> torch.Tensor:
        ctx.split, ctx.total = split, full.shape[0]
        start, stop = split.bounds(full.shape[0])
        return full[start:stop].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_rows(grad.contiguous(), ctx.split, ctx.total), None


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, split: TokenSplit, total: int) -> torch.Tensor:
        ctx.split, ctx.total = split, total
        return _all_gather_rows(local, split, total)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start, stop = ctx.split.bounds(ctx.total)
        return grad[start:stop].contiguous(), None, None


def scatter_rows(full: torch.Tensor, split: TokenSplit) -> torch.Tensor:
    """This tp rank's rows of a tensor replicated over tp (backward: all-gather)."""
    return _ScatterRows.apply(full, split)


def gather_rows(local: torch.Tensor, split: TokenSplit, total: int) -> torch.Tensor:
    """All `total` rows from every tp rank's share (backward: this rank's share)."""
    return _GatherRows.apply(local, split, total)


def token_split_from_mesh(tp_mesh: Any | None) -> TokenSplit | None:
    """A `TokenSplit` over a 1-D tp mesh of more than one rank, else None."""
    if tp_mesh is None or tp_mesh.size() == 1:
        return None
    return TokenSplit(tp_mesh.get_group(), tp_mesh.size(), tp_mesh.get_local_rank())


# ----------------------------------------------------------------------------- the TP plan

_EXPERT_MODULE_SUFFIXES = (".mlp.experts", ".mlp.gate")


def tp_plan_without_experts(model: nn.Module) -> dict[str, str]:
    """The HF model's tensor-parallel plan without its MoE entries (experts, router).

    Under TP x EP the experts are split over ranks whole (no TP inside an expert: fine-grained
    experts are too thin to split, torchtitan's choice) and the router stays replicated; the
    attention projections keep their styles, and the embedding and LM head get the ones
    meshtrain adds to HF plans. Names are prefixed with the base model's name in `model`.
    """
    config = getattr(model, "config", None)
    base_plan: Mapping[str, str] = getattr(config, "base_model_tp_plan", None) or {}
    base = getattr(model, "base_model", model)
    prefix = next((name for name, module in model.named_modules() if module is base), "")
    prefix = f"{prefix}." if prefix else ""
    plan = {
        f"{prefix}{key}": style
        for key, style in base_plan.items()
        if not any(f".{key}".endswith(s) or f".{key}".rsplit(".", 1)[0].endswith(s)
                   for s in _EXPERT_MODULE_SUFFIXES)
    }
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(embedding, nn.Embedding):
        plan.setdefault(_name_of(model, embedding), "embedding_rowwise")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear):
        plan.setdefault(_name_of(model, head), "colwise_gather_output")
    return plan


def _name_of(model: nn.Module, target: nn.Module) -> str:
    return next(name for name, module in model.named_modules() if module is target)
