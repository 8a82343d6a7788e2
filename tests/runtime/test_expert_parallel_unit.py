"""Single-process checks of the MoE building blocks against Hugging Face's Mixtral code."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import (
    MixtralExperts,
    MixtralSparseMoeBlock,
    load_balancing_loss_func,
)

from meshtrain.errors import ConfigError
from meshtrain_runtime.modules.moe import (
    GroupedExperts,
    MoE,
    MoEConfig,
    moe_aux_loss,
    router_losses,
)
from meshtrain_runtime.modules.moe_routing import install_hf_routing, select_experts, sinkhorn
from meshtrain_runtime.parallel.expert import find_expert_modules


def _mixtral_config(top_k: int = 2, num_experts: int = 4) -> MixtralConfig:
    return MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=num_experts,
        num_experts_per_tok=top_k, max_position_embeddings=64,
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"moe_load_balancing": "balanced"}, "neither Megatron-Core's router nor SMP's"),
        ({"moe_load_balancing": "aux_los"}, "Did you mean 'aux_loss'?"),
        ({"moe_aux_loss_coeff": -0.1}, "moe_aux_loss_coeff=-0.1 must be a number >= 0"),
        ({"moe_z_loss_coeff": "0.1"}, "moe_z_loss_coeff='0.1'"),
        ({"smp_moe": False}, "smp_moe=False"),
        ({"global_token_shuffle": True}, "dispatch is dropless"),
        ({"moe_all_to_all_dispatcher": False}, "dispatches tokens with all-to-all"),
    ],
)
def test_moe_config_rejects_bad_values(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("?", r"\?").replace("(", r"\(")):
        MoEConfig(**kwargs)


def test_moe_config_defaults_and_load_balancing_none():
    config = MoEConfig()
    assert (config.moe_load_balancing, config.moe_aux_loss_coeff, config.random_seed) == (
        "aux_loss", 0.001, 12345,
    )
    assert config.load_balancing_coeff == 0.001
    assert MoEConfig(moe_load_balancing="none", moe_aux_loss_coeff=0.5).load_balancing_coeff == 0


@pytest.mark.parametrize("with_mask", [False, True])
def test_router_losses_match_hugging_face(with_mask):
    torch.manual_seed(0)
    logits = tuple(torch.randn(24, 4, requires_grad=True) for _ in range(3))
    mask = (torch.rand(3, 8) > 0.4).long() if with_mask else None
    expected = load_balancing_loss_func(logits, 4, 2, mask)
    got, z_loss = router_losses(logits, 4, 2, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    weights = mask.reshape(-1).float() if with_mask else torch.ones(24)
    lse2 = torch.cat([lg.logsumexp(-1).pow(2) * weights for lg in logits]).sum()
    torch.testing.assert_close(z_loss, lse2 / (3 * weights.sum()), rtol=0, atol=1e-6)
    # Gradients flow to the router logits like Hugging Face's.
    (g_got,) = torch.autograd.grad(got, logits[0], retain_graph=True)
    (g_exp,) = torch.autograd.grad(expected, logits[0])
    torch.testing.assert_close(g_got, g_exp, rtol=0, atol=1e-7)


def test_grouped_experts_match_mixtral_experts():
    config = _mixtral_config()
    config._experts_implementation = "eager"  # set by from_config/from_pretrained normally
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config)
    for param in block.parameters():
        nn.init.normal_(param, std=0.1)
    ours = GroupedExperts(4, 32, 48)
    ours.load_state_dict(block.experts.state_dict())
    hidden = torch.randn(20, 32)
    _, weights, index = block.gate(hidden)
    weights, index = weights.detach(), index.clone()
    index[:5, 0], index[:5, 1] = 0, 1  # uneven loads; each row keeps two distinct experts
    assert isinstance(block.experts, MixtralExperts)
    expected = block.experts(hidden, index, weights)
    got = ours(hidden, index, weights)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    expected.sum().backward()
    got.sum().backward()
    for name in ("gate_up_proj", "down_proj"):
        torch.testing.assert_close(
            getattr(ours, name).grad, getattr(block.experts, name).grad, rtol=0, atol=1e-6
        )


def test_moe_layer_seeding_shapes_and_aux_loss():
    config = MoEConfig(random_seed=3, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
    torch.manual_seed(0)
    first = MoE(16, 24, num_experts=4, top_k=2, config=config)
    torch.manual_seed(99)  # the global RNG does not matter: every rank builds the same experts
    second = MoE(16, 24, num_experts=4, top_k=2, config=config)
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert torch.equal(a, b)
    other_layer = MoE(16, 24, num_experts=4, top_k=2, config=config, layer_id=1)
    assert not torch.equal(other_layer.router.weight, first.router.weight)

    model = nn.Sequential(first, other_layer)
    with pytest.raises(ValueError, match="run a forward pass first"):
        moe_aux_loss(model)
    x = torch.randn(2, 5, 16)
    out = model(x)
    assert out.shape == x.shape and not out._is_view()
    for layer in (first, other_layer):
        expected = 0.1 * layer.load_balancing_loss + 0.01 * layer.z_loss
        torch.testing.assert_close(layer.aux_loss, expected)
    torch.testing.assert_close(moe_aux_loss(model), first.aux_loss + other_layer.aux_loss)
    # Top-2 Switch/Mixtral load balancing is ~top_k when balanced, never below 1 per assignment.
    assert first.load_balancing_loss.item() > 1.0


def test_grouped_experts_reset_parameters_for_delayed_init():
    layer = MoE(64, 96, num_experts=4, top_k=2)
    assert layer.experts.init_std == 0.02
    layer.experts.init_std = 0.1
    layer.experts.reset_parameters()
    for param in layer.experts.parameters():
        assert 0.09 < param.std().item() < 0.11


def test_moe_layer_matches_a_dense_computation():
    layer = MoE(8, 12, num_experts=3, top_k=1, norm_topk_prob=False, activation="gelu")
    x = torch.randn(10, 8)
    out = layer(x)
    probs = torch.softmax(layer.router(x), dim=-1)
    top = probs.argmax(-1)
    experts = layer.experts
    for t in range(10):
        e = top[t]
        gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
        y = experts.down_proj[e] @ (torch.nn.functional.gelu(gate) * up)
        torch.testing.assert_close(out[t], probs[t, e] * y, rtol=0, atol=1e-6)


def test_moe_layer_bad_arguments():
    with pytest.raises(ConfigError, match="top_k=5 must be between 1 and num_experts=4"):
        MoE(8, 8, num_experts=4, top_k=5)
    with pytest.raises(ConfigError, match="activation='swish' is unknown"):
        MoE(8, 8, num_experts=4, activation="swish")


def test_find_expert_modules_follows_the_hf_ep_plan():
    model = MixtralForCausalLM(_mixtral_config())
    assert "layers.*.mlp.experts" in model.config.base_model_ep_plan
    names = [name for name, _ in find_expert_modules(model)]
    assert names == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert find_expert_modules(model.model)[0][0] == "layers.0.mlp.experts"
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, vocab_size=32))
    assert find_expert_modules(llama) == []
    custom = nn.Sequential(nn.Linear(8, 8), MoE(8, 8, num_experts=2))
    assert [name for name, _ in find_expert_modules(custom)] == ["1.experts"]


def test_find_expert_modules_rejects_other_expert_layouts():
    model = MixtralForCausalLM(_mixtral_config())
    model.model.layers[1].mlp.experts.is_transposed = True
    with pytest.raises(ConfigError, match=r"layers\.1\.mlp\.experts \(MixtralExperts\)"):
        find_expert_modules(model)


# ----------------------------------------------------------------------------- load balancing


def _megatron_sinkhorn(cost: torch.Tensor, tol: float = 1e-4) -> torch.Tensor:
    """Megatron-Core's moe_utils.sinkhorn written out as a while loop (the formula in
    docs/expert-parallel.md), independently of meshtrain's implementation."""
    cost = torch.exp(cost)
    d0, d1 = torch.ones(cost.size(0)), torch.ones(cost.size(1))
    error, d1_old = 1e9, d1
    while error > tol:
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + 1e-8)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + 1e-8)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def _skewed_logits() -> torch.Tensor:
    """Fixed logits where every token prefers expert 0: plain top-1 sends all 16 there."""
    torch.manual_seed(11)
    return torch.randn(16, 4) * 0.3 + torch.tensor([3.0, 0.0, 0.0, 0.0])


def test_sinkhorn_matches_the_formula_on_fixed_logits():
    logits = _skewed_logits()
    got = sinkhorn(logits)
    torch.testing.assert_close(got, _megatron_sinkhorn(logits), rtol=0, atol=1e-9)
    # Columns sum to 1/E exactly (the last update), rows to 1/T within the tolerance.
    torch.testing.assert_close(got.sum(0), torch.full((4,), 1 / 4), rtol=0, atol=1e-6)
    torch.testing.assert_close(got.sum(1), torch.full((16,), 1 / 16), rtol=0, atol=1e-3 / 16)
    assert not got.requires_grad


def test_sinkhorn_routing_balances_skewed_logits():
    logits = _skewed_logits().requires_grad_()
    _, plain = select_experts(logits, 1, "aux_loss")
    _, balanced = select_experts(logits, 1, "sinkhorn")
    assert torch.bincount(plain.reshape(-1), minlength=4).tolist() == [16, 0, 0, 0]
    counts = torch.bincount(balanced.reshape(-1), minlength=4)
    # Sinkhorn equalises the experts' shares, not the argmax counts: all used, none above 2x.
    assert counts.min() > 0 and counts.max() <= 8, counts.tolist()
    # Top-1 weights: sigmoid of the chosen logit (Megatron), before renormalisation.
    raw, _ = select_experts(logits, 1, "sinkhorn", normalize=False)
    torch.testing.assert_close(raw, torch.sigmoid(logits.gather(1, balanced)))
    # The router learns through the weights, not through the Sinkhorn matrix.
    (grad,) = torch.autograd.grad(raw.sum(), logits)
    assert grad.abs().sum() > 0
    # Eval mode: the plain top-k.
    _, evaluated = select_experts(logits, 1, "sinkhorn", training=False)
    assert torch.equal(evaluated, plain)


def test_top2_sinkhorn_weights_are_softmax_at_the_balanced_choice():
    logits = _skewed_logits()
    weights, index = select_experts(logits, 2, "sinkhorn")
    assert torch.equal(index, torch.topk(_megatron_sinkhorn(logits), 2).indices)
    probs = torch.softmax(logits, -1).gather(1, index)
    torch.testing.assert_close(weights, probs / probs.sum(-1, keepdim=True))


@pytest.mark.parametrize("mode", ["aux_loss", "sinkhorn", "none"])
def test_moe_layer_load_balancing_modes_against_a_hand_computed_reference(mode):
    config = MoEConfig(moe_load_balancing=mode, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01)
    layer = MoE(8, 12, num_experts=4, top_k=2, config=config)
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(4))
    out = layer(x)
    flat = x.reshape(-1, 8)
    logits = flat @ layer.router.weight.T
    probs = torch.softmax(logits, -1)
    index = torch.topk(_megatron_sinkhorn(logits.detach()) if mode == "sinkhorn" else probs,
                       2).indices
    weights = probs.gather(1, index)
    weights = weights / weights.sum(-1, keepdim=True)
    expected = torch.zeros_like(flat)
    for slot in range(2):
        for row in range(flat.shape[0]):
            e = index[row, slot]
            gate, up = (layer.experts.gate_up_proj[e] @ flat[row]).chunk(2)
            hidden = layer.experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up)
            expected[row] += weights[row, slot] * hidden
    torch.testing.assert_close(out.reshape(-1, 8), expected, rtol=1e-5, atol=1e-6)
    lb, z = router_losses(logits, 4, 2)
    added = 0.1 * lb if mode == "aux_loss" else 0.0
    torch.testing.assert_close(layer.aux_loss, added + 0.01 * z)


def test_hf_mixtral_router_uses_sinkhorn_once_installed():
    config = _mixtral_config()
    block = MixtralSparseMoeBlock(config)
    torch.nn.init.normal_(block.gate.weight, std=0.5)
    hidden = torch.randn(24, 32, generator=torch.Generator().manual_seed(2))
    logits, _, plain = block.gate(hidden)
    install_hf_routing([block.gate], "sinkhorn")
    again, weights, index = block.gate(hidden)
    torch.testing.assert_close(again, logits)
    assert torch.equal(index, torch.topk(_megatron_sinkhorn(logits.detach()), 2).indices)
    assert not torch.equal(index, plain)  # these logits are skewed enough to change a choice
    probs = torch.softmax(logits.detach(), -1).gather(1, index)
    torch.testing.assert_close(weights.detach(), probs / probs.sum(-1, keepdim=True))


def test_smp_moe_config_default_sinkhorn_is_honoured():
    from meshtrain_runtime.compat.smp.moe.moe_config import MoEConfig as SmpMoEConfig

    config = SmpMoEConfig()
    assert config.moe_load_balancing == "sinkhorn"
    # As in Megatron-Core, Sinkhorn routing adds no load-balancing loss; the z-loss stays.
    assert config.load_balancing_coeff == 0.0 and config.moe_z_loss_coeff == 0.001
