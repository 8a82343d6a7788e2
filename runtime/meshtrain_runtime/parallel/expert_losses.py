"""Router losses of a Hugging Face MoE model under expert parallelism, over the global batch.

`install_hf_router_losses` puts a forward hook on the ``...ForCausalLM`` (see
`_GlobalRouterLosses`); `meshtrain_runtime.parallel.expert.apply_expert_parallel` calls it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.modules.moe import MoEConfig, router_losses


class _GlobalRouterLosses:
    """Forward hook on an HF ``...ForCausalLM``: router losses over the global batch.

    Hugging Face computes ``aux_loss`` from the local batch only; with EP every rank sees
    different tokens, so the hook recomputes it (and the z-loss) from the same router logits
    with token sums over all data-parallel ranks, and adds both to ``loss``. The model's own
    ``router_aux_loss_coef`` is set to 0 so its local term is not added twice.
    """

    def __init__(self, num_experts: int, top_k: int, aux_coeff: float, z_coeff: float,
                 group: Any) -> None:
        self.num_experts, self.top_k = num_experts, top_k
        self.aux_coeff, self.z_coeff, self.group = aux_coeff, z_coeff, group

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if isinstance(output, tuple):
            requested = kwargs.get("output_router_logits")
            if requested or (requested is None and module.config.output_router_logits):
                raise ConfigError(
                    "return_dict=False is not supported with expert parallelism when router "
                    "logits are requested: use the default return_dict=True."
                )
            return None
        router_logits = getattr(output, "router_logits", None)
        if router_logits is None:
            return None
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        load_balancing, z_loss = router_losses(
            router_logits, self.num_experts, self.top_k, mask, self.group
        )
        if output.loss is not None:
            output.loss = output.loss + self.aux_coeff * load_balancing + self.z_coeff * z_loss
        output.aux_loss = load_balancing
        output.z_loss = z_loss
        return output


def install_hf_router_losses(
    model: nn.Module, group: Any, moe_config: MoEConfig | None
) -> None:
    """Replace each HF MoE model's local router losses by the global-batch ones (`group`)."""
    for module in model.modules():
        if not all(hasattr(module, a) for a in ("router_aux_loss_coef", "num_experts_per_tok")):
            continue
        aux_coeff = module.router_aux_loss_coef
        z_coeff = 0.0
        if moe_config is not None:
            aux_coeff, z_coeff = moe_config.load_balancing_coeff, moe_config.moe_z_loss_coeff
        module.router_aux_loss_coef = 0.0
        hook = _GlobalRouterLosses(
            module.num_experts, module.num_experts_per_tok, aux_coeff, z_coeff, group
        )
        module.register_forward_hook(hook, with_kwargs=True)
