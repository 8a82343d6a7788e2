"""Checkpointing policies on one process (CPU): "full", "selective" (op-level), every n-th block.

Parity: each policy trains a tiny HF Llama and a plain nn.Module (LayerNorm, SDPA attention,
biased linears, GELU, dropout) for 3 AdamW steps from the same seed and batch as eager; losses
and weights within 1e-5 (they are in fact bit-identical: the kept op outputs are the values a
recompute would produce, and the recompute replays dropout's RNG). What each policy recomputes
is counted, not timed: the matmuls executed in backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from meshtrain.contract.distribution import parse_smp_parameters
from meshtrain.errors import ConfigError
from meshtrain_runtime.parallel.activations import (
    apply_activation_checkpointing,
    checkpointed_blocks,
    resolve_activation_kwargs,
)
from meshtrain_runtime.parallel.selective import saved_ops

PARITY = 1e-5  # float32 loss and weights, same seed and batch (house rule)
POLICIES = {
    "full": {"policy": "full"},
    "selective": {"policy": "selective"},
    "full_every_2nd": {"policy": "full", "interval": 2},
    "selective_every_2nd": {"policy": "selective", "interval": 2},
    "selective_offload": {"policy": "selective", "offload": True, "loading_horizon": 1},
    "selective_offload_native": {"policy": "selective", "offload": True, "native_offload": True},
}
# Full checkpointing's recompute reruns q, k, v, o, gate and up: torch's non-reentrant
# checkpoint stops once backward has every tensor it needs, and down_proj's output is not one.
RECOMPUTED_MATMULS_PER_LLAMA_BLOCK = 6


def tiny_llama(layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
        attn_implementation="sdpa", tie_word_embeddings=False))


class PlainBlock(nn.Module):
    """Pre-norm attention (SDPA, biased projections) and a GELU MLP, dropout on both."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.out(attended.transpose(1, 2).reshape(b, s, w)))
        return x + self.dropout(self.down(F.gelu(self.up(self.norm2(x)))))


class PlainLM(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(PlainBlock(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(model, LlamaForCausalLM):
        return model(input_ids=ids, labels=ids).loss
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def train(model: nn.Module, steps: int = 3) -> tuple[list[float], dict[str, torch.Tensor]]:
    """3 AdamW steps on one batch, dropout's RNG seeded the same for every run."""
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(5)
    losses = []
    for _ in range(steps):
        loss = _loss(model, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def blocks_of(model: nn.Module) -> list[nn.Module]:
    return list(model.model.layers if isinstance(model, LlamaForCausalLM) else model.layers)


@pytest.mark.parametrize("kind", ["llama", "plain"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_each_policy_trains_like_eager(kind: str, policy: str) -> None:
    base = tiny_llama() if kind == "llama" else PlainLM()
    eager_losses, eager_weights = train(copy.deepcopy(base))
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, blocks_of(model), **POLICIES[policy])
    losses, weights = train(model)
    assert losses == pytest.approx(eager_losses, abs=PARITY, rel=0)
    assert max(float((weights[n] - eager_weights[n]).abs().max()) for n in weights) <= PARITY
    expected = 4 if "every_2nd" not in policy else 2
    assert len(checkpointed_blocks(model)) == expected


class _CountMatmuls(TorchDispatchMode):
    """Counts the matmuls that actually run (a selective block's cached ones do not)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _backward_matmuls(model: nn.Module) -> int:
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = _loss(model, ids)
    with _CountMatmuls() as counter:
        loss.backward()
    return counter.count


def test_selective_runs_no_matmul_twice() -> None:
    """Backward of full checkpointing reruns each block's projections; selective takes them
    from its cache, so its backward runs exactly the matmuls eager's does."""
    counts = {}
    for policy in ("none", "full", "selective"):
        model = tiny_llama()
        if policy != "none":
            apply_activation_checkpointing(model, blocks_of(model), policy=policy)
        counts[policy] = _backward_matmuls(model)
    assert counts["selective"] == counts["none"]
    assert counts["full"] == counts["none"] + 4 * RECOMPUTED_MATMULS_PER_LLAMA_BLOCK


def test_the_kept_ops_are_matmuls_attention_and_tp_reductions() -> None:
    names = {str(op) for op in saved_ops()}
    assert {"aten.mm.default", "aten.addmm.default",
            "aten._scaled_dot_product_flash_attention_for_cpu.default",
            "_c10d_functional.reduce_scatter_tensor.default"} <= names
    assert "aten.bmm.default" not in names  # an eager attention's s x s scores: recomputed


# --- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "policy"), [(False, "none"), (True, "full"), ("full", "full"),
                                               ("selective", "selective")])
def test_distribution_values_name_a_policy(value: object, policy: str) -> None:
    params = parse_smp_parameters({"activation_checkpointing": value})
    assert params.checkpointing_policy == policy
    kwargs = resolve_activation_kwargs(params)
    assert (kwargs or {}).get("policy", "none") == policy


@pytest.mark.parametrize(("value", "fragment"), [
    ("sellective", r"did you mean 'selective'\?"), ("op", "is not a checkpointing policy"),
    (2, "is not a checkpointing policy"), (None, "is not a checkpointing policy")])
def test_other_values_are_config_errors_with_the_fix(value: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as raised:
        parse_smp_parameters({"activation_checkpointing": value})
    message = str(raised.value)
    assert "'selective'" in message and message.endswith("or False.")
    assert not message.endswith("..")


def test_offloading_with_a_policy_is_accepted_and_needs_one() -> None:
    params = parse_smp_parameters({"activation_checkpointing": "selective",
                                   "activation_offloading": True})
    assert resolve_activation_kwargs(params)["offload"] is True
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        parse_smp_parameters({"activation_checkpointing": False, "activation_offloading": True})


def test_apply_refuses_an_unknown_policy() -> None:
    model = tiny_llama(layers=2)
    with pytest.raises(ConfigError, match="not a checkpointing policy"):
        apply_activation_checkpointing(model, blocks_of(model), policy="ops")
    assert checkpointed_blocks(model) == []


def test_transform_applies_the_policy_from_the_parameters(single_process_runtime) -> None:
    import meshtrain_runtime as mr

    base = tiny_llama(layers=2)
    mr.init({})
    eager_losses, _ = train(mr.transform(copy.deepcopy(base)))
    mr.reset()
    mr.init({"activation_checkpointing": "selective", "activation_checkpointing_interval": 2})
    model = mr.transform(copy.deepcopy(base))
    policies = [block.__dict__["_meshtrain_checkpoint"].policy
                for block in checkpointed_blocks(model)]
    assert policies == ["selective"]  # block 0 of 2
    losses, _ = train(model)
    assert losses == pytest.approx(eager_losses, abs=PARITY, rel=0)


@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "ZBVZeroBubble"])
def test_selective_is_refused_under_the_split_backward(schedule: str) -> None:
    """The zero-bubble schedules run each block's backward in two passes; torch's selective
    checkpointing gives its kept outputs to one recompute (a second one raises "Trying to
    backward an extra time"), so the contract refuses the pair before any process starts."""
    params = {"pipeline_parallel_degree": 2, "pipeline_schedule": schedule, "microbatches": 4,
              "activation_checkpointing": "selective"}
    with pytest.raises(ConfigError, match="activation_checkpointing=True") as raised:
        parse_smp_parameters(params)
    assert str(raised.value).endswith("'Interleaved1F1B'.")
    assert parse_smp_parameters({**params, "activation_checkpointing": True})
    assert parse_smp_parameters({**params, "pipeline_schedule": "Interleaved1F1B"})


def test_selective_cache_allows_one_recompute() -> None:
    """Why the refusal above: torch's split backward (input, then weights) on one selective
    block raises where full checkpointing recomputes twice."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    for policy, raises in (("full", False), ("selective", True)):
        model = tiny_llama(layers=1)
        block = model.model.layers[0]
        apply_activation_checkpointing(model, [block], policy=policy)
        x = torch.randn(2, 8, 64, requires_grad=True)
        rotary = model.model.rotary_emb(x, torch.arange(8)[None])
        y = block(x, position_embeddings=rotary, attention_mask=None)
        y = y[0] if isinstance(y, tuple) else y
        _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], block.parameters())
        if raises:
            with pytest.raises(RuntimeError, match="backward an extra time"):
                stage_backward_weight(block.parameters(), groups)
        else:
            stage_backward_weight(block.parameters(), groups)
            assert all(p.grad is not None for p in block.parameters())
