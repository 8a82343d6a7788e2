"""Activation checkpointing and offloading on one process (tiny HF Llama, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from meshtrain.contract.distribution import parse_smp_parameters
from meshtrain.errors import ConfigError
from meshtrain_runtime.diagnostics.memory import measure_saved_activations
from meshtrain_runtime.parallel.activations import (
    apply_activation_checkpointing,
    checkpointed_blocks,
    get_activation_offloader,
    get_offload_stats,
    resolve_activation_kwargs,
)
from meshtrain_runtime.parallel.offload import ActivationOffloader, NativeActivationOffloader


def tiny_llama(num_layers: int = 4, hidden: int = 64, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config)


def batch(seq: int = 32, size: int = 2) -> torch.Tensor:
    return torch.randint(0, 128, (size, seq), generator=torch.Generator().manual_seed(1))


def loss_and_grads(model: nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def layers(model: LlamaForCausalLM) -> list[nn.Module]:
    return list(model.model.layers)


# --- numerics ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"interval": 2},
        {"offload": True, "loading_horizon": 1},
        {"offload": True, "native_offload": True},
    ],
    ids=["every_block", "every_2nd", "offload_h1", "offload_native"],
)
def test_gradients_bit_identical_to_no_checkpointing(kwargs: dict) -> None:
    base = tiny_llama()
    ids = batch()
    ref_loss, ref_grads = loss_and_grads(base, ids)
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, layers(model), **kwargs)
    loss, grads = loss_and_grads(model, ids)
    assert list(grads) == list(ref_grads)  # parameter names unchanged
    assert loss == ref_loss
    assert all(torch.equal(grads[name], ref_grads[name]) for name in ref_grads)


def test_interval_checkpoints_blocks_0_n_2n() -> None:
    model = tiny_llama(num_layers=5)
    apply_activation_checkpointing(model, layers(model), interval=2)
    chosen = checkpointed_blocks(model)
    assert chosen == [model.model.layers[i] for i in (0, 2, 4)]
    # Same class name and state dict keys: find_blocks and checkpoints see the model unchanged.
    assert type(chosen[0]).__name__ == "LlamaDecoderLayer"
    assert set(model.state_dict()) == set(tiny_llama(num_layers=5).state_dict())


def test_saved_activation_bytes_drop_at_least_5x() -> None:
    """4 blocks, sequence length 256: checkpointing keeps only the blocks' inputs."""
    base = tiny_llama(num_layers=4)
    ids = batch(seq=256, size=2)
    without = measure_saved_activations(lambda: base(ids, labels=ids).loss)
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, layers(model))
    with_ac = measure_saved_activations(lambda: model(ids, labels=ids).loss)
    print(f"saved activation bytes: without checkpointing {without.bytes}, "
          f"with {with_ac.bytes} ({without.bytes / with_ac.bytes:.1f}x lower)")
    assert with_ac.bytes * 5 <= without.bytes
    every_2nd = copy.deepcopy(base)
    apply_activation_checkpointing(every_2nd, layers(every_2nd), interval=2)
    partial = measure_saved_activations(lambda: every_2nd(ids, labels=ids).loss)
    assert with_ac.bytes < partial.bytes < without.bytes


def test_no_grad_forward_runs_plainly() -> None:
    base = tiny_llama()
    ids = batch()
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, layers(model), offload=True)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base(ids).logits)
    assert get_offload_stats(model).blocks_offloaded == 0


def test_kv_cache_not_written_by_checkpointed_blocks() -> None:
    """As with HF's own checkpointing: a recompute would write the cache a second time."""
    base = tiny_llama()
    ids = batch()
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, layers(model))
    out = model(ids, labels=ids, use_cache=True)
    out.loss.backward()
    assert out.past_key_values.get_seq_length() == 0
    plain = base(ids, labels=ids, use_cache=True)
    assert plain.past_key_values.get_seq_length() == ids.shape[1]
    assert out.loss.item() == plain.loss.item()


def test_retain_graph_reloads_offloaded_inputs() -> None:
    base = tiny_llama()
    ids = batch()
    model = copy.deepcopy(base)
    apply_activation_checkpointing(model, layers(model), offload=True, loading_horizon=2)
    for net in (base, model):
        net.zero_grad()
        loss = net(ids, labels=ids).loss
        loss.backward(retain_graph=True)
        loss.backward()
    for (name, p), q in zip(base.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    assert get_offload_stats(model).loads == 2 * 4


def test_deepcopy_keeps_checkpointing() -> None:
    model = tiny_llama()
    apply_activation_checkpointing(model, layers(model), offload=True)
    clone = copy.deepcopy(model)
    assert len(checkpointed_blocks(clone)) == 4
    ids = batch()
    assert loss_and_grads(clone, ids)[0] == loss_and_grads(model, ids)[0]
    assert get_offload_stats(clone).blocks_offloaded == 4


# --- loading horizon ----------------------------------------------------------------------------
def replay(trace: list[tuple[str, int]]) -> tuple[int, list[int]]:
    """Resident set from the trace: max size, and blocks used while not resident."""
    resident: set[int] = set()
    peak, misses = 0, []
    for event, seq in trace:
        if event == "load":
            resident.add(seq)
        elif event in ("release", "free"):
            resident.discard(seq)
        elif event == "use" and seq not in resident:
            misses.append(seq)
        peak = max(peak, len(resident))
    return peak, misses


@pytest.mark.parametrize("horizon", [1, 2, 4])
def test_horizon_bounds_resident_blocks(horizon: int) -> None:
    num_blocks, steps = 6, 2
    model = tiny_llama(num_layers=num_blocks, hidden=32)
    apply_activation_checkpointing(model, layers(model), offload=True, loading_horizon=horizon)
    stats = get_offload_stats(model)
    stats.trace = []
    ids = batch(seq=16)
    for _ in range(steps):
        model(ids, labels=ids).loss.backward()
    peak, misses = replay(stats.trace)
    print(f"horizon {horizon}: max resident {stats.max_resident_blocks}, replayed {peak}, "
          f"loads {stats.loads} (on demand {stats.on_demand_loads})")
    assert misses == []
    assert peak == stats.max_resident_blocks == horizon  # reached, never exceeded
    assert stats.blocks_offloaded == stats.loads == num_blocks * steps
    # With a horizon of 1 only the first block is prefetched (at the end of forward); with
    # more, every block is loaded ahead of its use.
    expected_on_demand = (num_blocks - 1) * steps if horizon == 1 else 0
    assert stats.on_demand_loads == expected_on_demand
    loads = [seq for event, seq in stats.trace if event == "load"]
    assert loads == sorted(loads, key=lambda s: (s // num_blocks, -s))  # newest block first


def test_horizon_larger_than_blocks_keeps_all_resident() -> None:
    model = tiny_llama(num_layers=3, hidden=32)
    apply_activation_checkpointing(model, layers(model), offload=True, loading_horizon=8)
    ids = batch(seq=16)
    model(ids, labels=ids).loss.backward()
    stats = get_offload_stats(model)
    assert stats.max_resident_blocks == 3
    assert stats.on_demand_loads == 0
    assert get_activation_offloader(model).resident_blocks() == 0  # all freed after backward


def test_offloader_selection() -> None:
    own, native = tiny_llama(), tiny_llama()
    apply_activation_checkpointing(own, layers(own), offload=True)
    apply_activation_checkpointing(native, layers(native), offload=True, native_offload=True)
    assert isinstance(get_activation_offloader(own), ActivationOffloader)
    assert isinstance(get_activation_offloader(native), NativeActivationOffloader)
    plain = tiny_llama()
    apply_activation_checkpointing(plain, layers(plain), native_offload=True)
    assert get_activation_offloader(plain) is None  # native_offload only picks the implementation


# --- configuration ------------------------------------------------------------------------------
def test_resolve_activation_kwargs_from_distribution_keys() -> None:
    assert resolve_activation_kwargs(parse_smp_parameters({})) is None
    params = parse_smp_parameters({
        "activation_checkpointing": True, "activation_checkpointing_interval": 3,
        "activation_offloading": True, "activation_loading_horizon": 4,
    })
    assert resolve_activation_kwargs(params) == {
        "policy": "full", "interval": 3, "offload": True, "native_offload": False,
        "loading_horizon": 4,
    }
    native = parse_smp_parameters({
        "activation_checkpointing": True, "activation_offloading": True,
        "sm_activation_offloading": False,
    })
    assert resolve_activation_kwargs(native)["native_offload"] is True


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"activation_offloading": True}, "activation_checkpointing"),
        ({"activation_checkpointing": True, "activation_loading_horizon": 0},
         "activation_loading_horizon"),
        ({"activation_checkpointing": True, "activation_checkpointing_interval": 0},
         "activation_checkpointing_interval"),
    ],
)
def test_contract_rejects_bad_keys(parameters: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_smp_parameters(parameters)


@pytest.mark.parametrize("horizon", [0, -1, True, 1.5])
def test_bad_horizon(horizon: object) -> None:
    model = tiny_llama(num_layers=2)
    with pytest.raises(ConfigError, match="activation_loading_horizon"):
        apply_activation_checkpointing(model, layers(model), offload=True, loading_horizon=horizon)


@pytest.mark.parametrize("interval", [0, -2, False])
def test_bad_interval(interval: object) -> None:
    model = tiny_llama(num_layers=2)
    with pytest.raises(ConfigError, match="activation_checkpointing_interval"):
        apply_activation_checkpointing(model, layers(model), interval=interval)


@pytest.mark.parametrize("offload", [False, True])
def test_no_blocks_found(offload: bool) -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    feature = "activation_offloading" if offload else "activation_checkpointing"
    with pytest.raises(ConfigError, match=f"{feature}=True but no transformer blocks"):
        apply_activation_checkpointing(model, [], offload=offload)


def test_bad_blocks() -> None:
    model = tiny_llama(num_layers=2)
    with pytest.raises(ConfigError, match="not a submodule"):
        apply_activation_checkpointing(model, [nn.Linear(2, 2)])
    with pytest.raises(ConfigError, match="same module twice"):
        apply_activation_checkpointing(model, [model.model.layers[0]] * 2)
    with pytest.raises(ConfigError, match="lies inside block"):
        apply_activation_checkpointing(model, [model.model.layers[0],
                                               model.model.layers[0].mlp])


def test_applying_twice_or_over_hf_checkpointing() -> None:
    model = tiny_llama(num_layers=2)
    apply_activation_checkpointing(model, layers(model))
    with pytest.raises(ConfigError, match="already checkpointed"):
        apply_activation_checkpointing(model, layers(model))
    hf = tiny_llama(num_layers=2)
    hf.activation_checkpointing_enable()
    with pytest.raises(ConfigError, match="activation_checkpointing_disable"):
        apply_activation_checkpointing(hf, layers(hf))


def test_offload_needs_a_positional_tensor_input() -> None:
    """Offloading a block whose inputs all come as keywords would move nothing."""

    class KeywordBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, *, hidden: torch.Tensor) -> torch.Tensor:
            return self.linear(hidden).relu()

    model = nn.ModuleList([KeywordBlock()])
    apply_activation_checkpointing(model, list(model), offload=True)
    with pytest.raises(ConfigError, match="no positional tensor argument"):
        model[0](hidden=torch.randn(2, 4, requires_grad=True))
    with torch.no_grad():  # nothing is saved without grad: runs
        model[0](hidden=torch.randn(2, 4))
