"""Expert selection under `MoEConfig.moe_load_balancing`: top-k and Sinkhorn-normalised routing.

Sinkhorn routing follows Megatron-Core's router (``sinkhorn_load_balancing`` with its
``moe_utils.sinkhorn``): while training, the experts of each token are the top-k of the
Sinkhorn-normalised matrix ``S = diag(d0) exp(logits) diag(d1)``, whose rows each sum to about
``1/T`` and whose columns each sum to ``1/E`` (every expert gets the same share of the batch);
the routing weights are the ordinary router probabilities at those experts, so the router still
learns through them. In eval mode the plain top-k is used. ``S`` carries no gradient.

The scaling vectors are iterated from ``d0 = d1 = 1``::

    d0 = (1/T) / (exp(logits) @ d1 + eps)
    d1 = (1/E) / (exp(logits).T @ d0 + eps)        eps = 1e-8

until ``mean(|d1 - d1_previous|) <= tol`` (``SINKHORN_TOL = 1e-4``, Megatron's default).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SINKHORN_TOL = 1e-4
_SINKHORN_EPS = 1e-8
# Guard against a loop that never meets the tolerance (it converges in a few dozen steps).
_SINKHORN_MAX_ITERS = 10_000


@torch.no_grad()
def sinkhorn(logits: torch.Tensor, tol: float = SINKHORN_TOL) -> torch.Tensor:
    """Sinkhorn-normalise ``exp(logits)`` (``(tokens, experts)``), as Megatron-Core does.

    Computed in float32 without gradient. Columns of the result sum to ``1/E`` exactly (up to
    eps) and rows to ``1/T`` within the tolerance of the last update.
    """
    cost = torch.exp(logits.float())
    tokens, experts = cost.shape
    d0 = torch.ones(tokens, dtype=cost.dtype, device=cost.device)
    d1 = torch.ones(experts, dtype=cost.dtype, device=cost.device)
    for _ in range(_SINKHORN_MAX_ITERS):
        d0 = (1.0 / tokens) / (cost @ d1 + _SINKHORN_EPS)
        d1_new = (1.0 / experts) / (cost.T @ d0 + _SINKHORN_EPS)
        error = (d1_new - d1).abs().mean()
        d1 = d1_new
        if error <= tol:
            break
    return d1 * cost * d0.unsqueeze(1)


def select_experts(
    logits: torch.Tensor,
    top_k: int,
    load_balancing: str = "aux_loss",
    *,
    training: bool = True,
    normalize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k weights (float32), top-k expert ids) for ``(tokens, experts)`` router logits.

    ``"aux_loss"`` and ``"none"``: the top-k of the softmax probabilities (Mixtral's router).
    ``"sinkhorn"`` while training: the experts are the top-k of `sinkhorn` (logits), the
    weights the softmax probabilities there (sigmoid of the logit for top-1, as Megatron-Core).
    `normalize` rescales the k weights to sum to one (Mixtral, `MoE` ``norm_topk_prob``).
    """
    sinkhorn_mode = load_balancing == "sinkhorn"
    if sinkhorn_mode and top_k == 1:
        probs = torch.sigmoid(logits.float())
    else:
        probs = torch.softmax(logits.float(), dim=-1)
    if sinkhorn_mode and training:
        index = torch.topk(sinkhorn(logits), top_k, dim=-1).indices
        weights = probs.gather(1, index)
    else:
        weights, index = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, index


class _RouterOverride:
    """Forward hook on a Hugging Face top-k router (Mixtral's ``mlp.gate``): recompute its
    ``(router_logits, scores, indices)`` from its own logits under a load-balancing mode."""

    def __init__(self, load_balancing: str) -> None:
        self.load_balancing = load_balancing

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> Any:
        logits = output[0]
        weights, index = select_experts(
            logits, module.top_k, self.load_balancing, training=module.training, normalize=True
        )
        return logits, weights, index


def install_hf_routing(routers: list[nn.Module], load_balancing: str) -> None:
    """Make Hugging Face top-k routers select experts by `load_balancing` (only "sinkhorn"
    changes their choice; the other modes keep Hugging Face's own top-k)."""
    if load_balancing != "sinkhorn":
        return
    for router in routers:
        router.register_forward_hook(_RouterOverride(load_balancing))
