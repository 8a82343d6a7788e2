"""Mixture-of-experts for meshtrain: `MoEConfig`, router losses and a generic `MoE` layer.

`MoEConfig` mirrors SMP v2's ``torch.sagemaker.moe.moe_config.MoEConfig`` (same field names) so a
script written for SMP passes the same object to ``meshtrain_runtime.transform(model,
config=MoEConfig(...))``. The `MoE` layer is a drop-in feed-forward block for custom models; its
expert weights use Hugging Face Mixtral's fused 3-D layout, so `apply_expert_parallel` treats
both the same way.

Router losses follow two references:

* load balancing: Switch Transformer eqs. (4)-(6), as Hugging Face's ``load_balancing_loss_func``
  computes it: ``num_experts * sum_e f_e * P_e`` with ``f_e`` the fraction of top-k assignments
  that went to expert ``e`` and ``P_e`` its mean router probability;
* router z-loss (ST-MoE): the mean over tokens of ``logsumexp(router_logits) ** 2``.

Both are means over tokens. With expert parallelism every data-parallel rank sees different
tokens, so the per-rank sums are added up over the data-parallel group (one small autograd
all-gather of ``2 * num_experts + 2`` numbers) before dividing: the loss then equals the loss a
single process computes on the whole global batch, and its gradient is right once the gradient
is averaged over the data-parallel ranks (which FSDP does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.modules.moe_routing import select_experts

SUPPORTED_LOAD_BALANCING = ("aux_loss", "sinkhorn", "none")
# SMP values meshtrain refuses, with the reason.
_REFUSED_LOAD_BALANCING = {
    "balanced": (
        "SMP documents it only by name, and neither Megatron-Core's router nor SMP's "
        "documentation defines its algorithm, so meshtrain cannot reproduce it faithfully"
    ),
}

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
}


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts options, with SMP v2's `MoEConfig` field names.

    Attributes:
        smp_moe: must stay True: meshtrain replaces the model's expert computation (SMP's
            ``smp_moe=False`` keeps Hugging Face's own MoE, which has no expert parallelism).
        random_seed: seeds the initialisation of meshtrain `MoE` layers, identically on every
            rank (expert parallelism keeps each rank's slice of the same full weights).
        moe_load_balancing: ``"aux_loss"`` adds ``moe_aux_loss_coeff * load-balancing loss``;
            ``"sinkhorn"`` picks experts by Sinkhorn-normalised routing while training
            (`meshtrain_runtime.modules.moe_routing`) and, as in Megatron-Core, adds no
            load-balancing loss; ``"none"`` adds none either. The loss is still reported in
            every mode. SMP's ``"balanced"`` is refused (no published definition).
            meshtrain's default is ``"aux_loss"``; SMP's (``torch.sagemaker``) is ``"sinkhorn"``.
        global_token_shuffle: SMP option; only False (refused: see `__post_init__`).
        moe_all_to_all_dispatcher: SMP option; only True (all-to-all token dispatch).
        moe_aux_loss_coeff: weight of the load-balancing loss.
        moe_z_loss_coeff: weight of the router z-loss.
    """

    smp_moe: bool = True
    random_seed: int = 12345
    moe_load_balancing: str = "aux_loss"
    global_token_shuffle: bool = False
    moe_all_to_all_dispatcher: bool = True
    moe_aux_loss_coeff: float = 0.001
    moe_z_loss_coeff: float = 0.001

    def __post_init__(self) -> None:
        _check_load_balancing(self.moe_load_balancing)
        for name in ("moe_aux_loss_coeff", "moe_z_loss_coeff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"MoEConfig {name}={value!r} must be a number >= 0.")
        if not self.smp_moe:
            raise ConfigError(
                "MoEConfig smp_moe=False keeps the model's own MoE implementation, which has no "
                "expert parallelism in meshtrain. Use smp_moe=True."
            )
        if self.global_token_shuffle:
            raise ConfigError(
                "MoEConfig global_token_shuffle=True is not supported by meshtrain: the shuffle "
                "spreads tokens over the EP group so that capacity-limited experts drop fewer "
                "of them, but meshtrain's dispatch is dropless (no capacity factor), and it "
                "would change the token sets Sinkhorn routing normalises over. Use "
                "global_token_shuffle=False."
            )
        if not self.moe_all_to_all_dispatcher:
            raise ConfigError(
                "MoEConfig moe_all_to_all_dispatcher=False (SMP's all-gather dispatcher, which "
                "gathers every token of the EP group on every rank) is not supported: meshtrain "
                "dispatches tokens with all-to-all only. Use moe_all_to_all_dispatcher=True."
            )

    @property
    def load_balancing_coeff(self) -> float:
        """The coefficient actually applied to the load-balancing loss."""
        return float(self.moe_aux_loss_coeff) if self.moe_load_balancing == "aux_loss" else 0.0


def _check_load_balancing(value: object) -> None:
    if value in SUPPORTED_LOAD_BALANCING:
        return
    if value in _REFUSED_LOAD_BALANCING:
        raise ConfigError(
            f"MoEConfig moe_load_balancing={value!r} is an SMP option meshtrain does not "
            f"support: {_REFUSED_LOAD_BALANCING[value]}. Use one of "
            f"{', '.join(map(repr, SUPPORTED_LOAD_BALANCING))}."
        )
    raise ConfigError(
        f"MoEConfig moe_load_balancing={value!r} is unknown; use one of "
        f"{', '.join(map(repr, SUPPORTED_LOAD_BALANCING))}."
        f"{did_you_mean(str(value), SUPPORTED_LOAD_BALANCING)}"
    )


# ----------------------------------------------------------------------------- router losses


def router_statistics(
    router_logits: torch.Tensor,
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-rank sums behind the router losses, as one vector of ``2 * num_experts + 2``.

    Layout: top-k assignments per expert (no gradient), router probability per expert, the
    z-loss sum ``sum logsumexp(logits) ** 2``, and the number of (unmasked) tokens.
    `router_logits` is ``(tokens, num_experts)``; `attention_mask` has one entry per token.
    """
    logits = router_logits.float()
    probs = torch.softmax(logits, dim=-1)
    selected = torch.topk(probs, top_k, dim=-1).indices
    if attention_mask is None:
        token_weight = torch.ones(logits.shape[0], device=logits.device)
    else:
        token_weight = attention_mask.reshape(-1).to(device=logits.device, dtype=torch.float32)
    counts = torch.zeros(num_experts, device=logits.device).scatter_add_(
        0, selected.reshape(-1), token_weight.repeat_interleave(top_k)
    )
    prob_sum = (probs * token_weight.unsqueeze(-1)).sum(dim=0)
    z_sum = (torch.logsumexp(logits, dim=-1).pow(2) * token_weight).sum()
    return torch.cat([counts, prob_sum, z_sum.reshape(1), token_weight.sum().reshape(1)])


def reduce_router_statistics(stats: torch.Tensor, group: object | None) -> torch.Tensor:
    """Sum `stats` over `group` (a ProcessGroup or 1-D DeviceMesh) with gradient flow.

    An all-gather whose backward is a reduce-scatter: each rank's sums receive the gradient
    of every rank's (identical) loss, which the data-parallel gradient average then divides.
    """
    if group is None:
        return stats
    from meshtrain_runtime import torch_api

    gathered = torch_api.all_gather_autograd(stats.unsqueeze(0), group)
    return torch_api.wait_collective(gathered).sum(dim=0)


def losses_from_statistics(
    stats: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(load-balancing loss, z-loss) from (possibly reduced) `router_statistics` sums."""
    counts = stats[:num_experts].detach()
    prob_sum = stats[num_experts : 2 * num_experts]
    z_sum, rows = stats[2 * num_experts], stats[2 * num_experts + 1].detach()
    load_balancing = num_experts * torch.sum((counts / rows) * (prob_sum / rows))
    return load_balancing, z_sum / rows


def router_losses(
    router_logits: torch.Tensor | Sequence[torch.Tensor],
    num_experts: int,
    top_k: int,
    attention_mask: torch.Tensor | None = None,
    group: object | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load-balancing loss and router z-loss over the global batch.

    `router_logits` is one ``(tokens, num_experts)`` tensor or a sequence of them (one per
    layer, Hugging Face's ``router_logits`` output); a sequence is pooled over layers exactly as
    ``transformers``' ``load_balancing_loss_func`` does. With `group` (the data-parallel group)
    the token sums are added up over its ranks, so every rank gets the loss of the whole
    global batch. Without it the result equals Hugging Face's function on the local batch.
    """
    layers = [router_logits] if isinstance(router_logits, torch.Tensor) else list(router_logits)
    if not layers:
        raise ValueError("router_losses needs at least one layer of router logits")
    stats = sum(router_statistics(lg, num_experts, top_k, attention_mask) for lg in layers)
    return losses_from_statistics(reduce_router_statistics(stats, group), num_experts)


# ----------------------------------------------------------------------------- expert compute


def sort_by_expert(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Order the ``tokens * top_k`` assignments by expert.

    Returns (order, token_index, counts): `order` permutes the flattened assignments so experts
    are contiguous, `token_index[i]` is the token of sorted assignment ``i`` and `counts[e]` the
    number of assignments of expert ``e``.
    """
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_index = torch.div(order, top_k_index.shape[-1], rounding_mode="floor")
    counts = torch.bincount(flat, minlength=num_experts)
    return order, token_index, counts


def run_experts(
    tokens: torch.Tensor,
    counts: Sequence[int],
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    act_fn: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Apply expert ``e`` to its contiguous rows of `tokens` (``counts[e]`` of them).

    Weights are Mixtral's fused layout: ``gate_up_proj`` ``(E, 2I, H)`` and ``down_proj``
    ``(E, H, I)``. Every expert runs, also on zero rows, so each weight always gets a gradient
    (FSDP's gradient reduce-scatter needs the same gradients on every rank).
    """
    outputs = []
    for expert, rows in enumerate(tokens.split(list(counts), dim=0)):
        gate, up = F.linear(rows, gate_up_proj[expert]).chunk(2, dim=-1)
        outputs.append(F.linear(act_fn(gate) * up, down_proj[expert]))
    return torch.cat(outputs, dim=0)


def combine_expert_outputs(
    hidden_states: torch.Tensor,
    expert_out: torch.Tensor,
    order: torch.Tensor,
    token_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Weight each sorted assignment's output by its routing weight and sum per token."""
    weighted = expert_out * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(hidden_states).index_add(
        0, token_index, weighted.to(hidden_states.dtype)
    )


class GroupedExperts(nn.Module):
    """`num_experts` gated MLPs (``down(act(gate(x)) * up(x))``) stored as two 3-D tensors.

    Same layout and call signature as Hugging Face's ``MixtralExperts``:
    ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``.
    """

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, activation: str = "silu"
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(
                f"MoE activation={activation!r} is unknown; use one of {', '.join(ACTIVATIONS)}."
            )
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size)
        )
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.act_fn = ACTIVATIONS[activation]
        self.init_std = 0.02

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) from the global RNG (delayed initialisation calls this)."""
        for param in (self.gate_up_proj, self.down_proj):
            param.normal_(0.0, self.init_std)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        order, token_index, counts = sort_by_expert(top_k_index, self.num_experts)
        expert_out = run_experts(
            hidden_states[token_index], counts.tolist(), self.gate_up_proj, self.down_proj,
            self.act_fn,
        )
        return combine_expert_outputs(hidden_states, expert_out, order, token_index, top_k_weights)


class MoE(nn.Module):
    """A sparse mixture-of-experts feed-forward layer for custom models.

    ``y = sum_{e in top_k(x)} w_e(x) * expert_e(x)`` with a linear router (no bias), softmax
    probabilities in float32, top-k selection and (by default) the top-k weights renormalised to
    sum to one, as in Mixtral. Use it where a dense MLP would go; it accepts ``(..., hidden)``
    and returns the same shape. ``apply_expert_parallel`` (or ``transform`` with
    ``expert_parallel_degree > 1``) later splits its experts over ranks.

    After each forward the layer holds its router losses:

    * ``load_balancing_loss`` and ``z_loss``: the raw losses (tensors with gradient);
    * ``aux_loss``: ``load_balancing_coeff * load_balancing_loss + moe_z_loss_coeff * z_loss``,
      ready to add to the training loss. ``moe_aux_loss(model)`` sums it over all layers::

          loss = criterion(model(x), y) + moe_aux_loss(model)

    Args:
        hidden_size: model width H.
        intermediate_size: width I of each expert's hidden layer.
        num_experts: number of experts E.
        top_k: experts per token.
        config: `MoEConfig` (coefficients, load balancing, seed); SMP's defaults if None.
        activation: ``"silu"`` (default), ``"gelu"`` or ``"relu"``.
        norm_topk_prob: renormalise the top-k probabilities (Mixtral); False keeps the raw
            probabilities (Switch Transformer top-1).
        layer_id: mixed into the seed so that layers start different.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int = 2,
        *,
        config: MoEConfig | None = None,
        activation: str = "silu",
        norm_topk_prob: bool = True,
        layer_id: int = 0,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ConfigError(
                f"MoE top_k={top_k} must be between 1 and num_experts={num_experts}."
            )
        self.config = config if config is not None else MoEConfig()
        self.hidden_size = hidden_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.layer_id = layer_id
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = GroupedExperts(num_experts, hidden_size, intermediate_size, activation)
        # Set by apply_expert_parallel: the data-parallel group the router losses are summed over.
        self.aux_loss_group: object | None = None
        self.load_balancing_loss: torch.Tensor | None = None
        self.z_loss: torch.Tensor | None = None
        self.aux_loss: torch.Tensor | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) weights from a generator seeded with random_seed + layer_id.

        Independent of the global RNG, so every rank builds identical experts.
        """
        params = [self.router.weight, self.experts.gate_up_proj, self.experts.down_proj]
        if any(p.is_meta for p in params):
            return
        self.experts.init_std = std
        generator = torch.Generator().manual_seed(self.config.random_seed + self.layer_id)
        for param in params:
            values = torch.empty(param.shape, dtype=param.dtype)
            param.copy_(values.normal_(0.0, std, generator=generator))

    def route(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(router_logits, top_k_weights, top_k_index) for ``(tokens, hidden)`` inputs."""
        logits = self.router(hidden_states)
        weights, index = select_experts(
            logits, self.top_k, self.config.moe_load_balancing, training=self.training,
            normalize=self.norm_topk_prob,
        )
        return logits, weights, index

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        flat = hidden_states.reshape(-1, self.hidden_size)
        logits, weights, index = self.route(flat)
        out = self.experts(flat, index, weights)
        self.load_balancing_loss, self.z_loss = router_losses(
            logits, self.num_experts, self.top_k, group=self.aux_loss_group
        )
        self.aux_loss = (
            self.config.load_balancing_coeff * self.load_balancing_loss
            + self.config.moe_z_loss_coeff * self.z_loss
        )
        if len(shape) == 2:
            return out
        # A fresh tensor, not a view: FSDP warns when a wrapped module returns a view.
        return out.reshape(shape).clone()


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """Sum of ``aux_loss`` over the model's `MoE` layers from their latest forward."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None]
    if not losses:
        raise ValueError(
            f"{type(model).__name__} has no MoE layer with an aux_loss: run a forward pass first"
        )
    return torch.stack(losses).sum()
