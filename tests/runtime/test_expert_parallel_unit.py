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
        ({"moe_load_balancing": "sinkhorn"}, "SMP option meshtrain does not support"),
        ({"moe_load_balancing": "balanced"}, "SMP option meshtrain does not support"),
        ({"moe_load_balancing": "aux_los"}, "Did you mean 'aux_loss'?"),
        ({"moe_aux_loss_coeff": -0.1}, "moe_aux_loss_coeff=-0.1 must be a number >= 0"),
        ({"moe_z_loss_coeff": "0.1"}, "moe_z_loss_coeff='0.1'"),
        ({"smp_moe": False}, "smp_moe=False"),
        ({"global_token_shuffle": True}, "global_token_shuffle=True is not supported"),
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
