"""`fp8: true` in one process: which linears become torchao's Float8Linear, and transform()'s order.

CPU has no float8 tensor cores, so transform() refuses fp8 here (test_compile_config.py). torch's
CPU `_scaled_mm` still computes float8 matmuls (slowly), which lets the conversion and training
run: the transform() cases below switch the device check off (the one thing they do not test).
Training on gloo ranks with FSDP2's float8 all-gather: test_hsdp_layouts.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ci_guards import import_or_skip

from meshtrain.errors import ConfigError

# missing: a skip with the reason (a failure under CI=true); installed but broken: an error
import_or_skip("torchao")
import_or_skip("transformers")

BLOCK_LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def _llama(hidden: int = 64, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
        max_position_embeddings=32))


def _float8_names(model: torch.nn.Module) -> list[str]:
    from torchao.float8.float8_linear import Float8Linear

    return [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]


def test_every_aligned_linear_of_the_blocks_is_converted_and_the_head_is_not() -> None:
    from meshtrain_runtime.parallel.float8 import apply_float8

    model = _llama()
    keys = list(model.state_dict())
    names = apply_float8(model, list(model.model.layers), fsdp_float8_all_gather=False)
    expected = [f"model.layers.{i}.{linear}" for i in range(2) for linear in BLOCK_LINEARS]
    assert names == expected
    assert _float8_names(model) == expected  # lm_head (64 -> 128) stays a plain nn.Linear
    assert list(model.state_dict()) == keys  # checkpoints keep their keys
    ids = torch.randint(0, 128, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[0].mlp.up_proj.weight.grad is not None


def test_moe_routers_and_experts_stay_as_they_are() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    from meshtrain_runtime.parallel.float8 import apply_float8

    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, num_local_experts=4, num_experts_per_tok=2))
    names = apply_float8(model, list(model.model.layers), fsdp_float8_all_gather=False)
    assert all(".self_attn." in name for name in names) and len(names) == 8, names
    assert not any("gate" in name or "experts" in name for name in names)


def test_no_aligned_linear_is_a_config_error_and_changes_nothing() -> None:
    from meshtrain_runtime.parallel.float8 import apply_float8

    model = _llama(hidden=24)  # 24 is not a multiple of 16
    with pytest.raises(ConfigError, match="multiples of 16") as error:
        apply_float8(model, list(model.model.layers), fsdp_float8_all_gather=False)
    assert "LlamaForCausalLM has none (2 block(s) found)" in str(error.value)
    assert _float8_names(model) == []


def _train(model: torch.nn.Module, steps: int = 4) -> list[float]:
    """AdamW on one fixed batch: the loss must fall."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


@pytest.fixture
def fp8_on_cpu(single_process_runtime: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """transform() without its device check (the CPU has no float8 tensor cores)."""
    from meshtrain_runtime import parallelize

    monkeypatch.setattr(parallelize, "check_fp8", lambda enabled, device: None)
    return single_process_runtime


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_transform_converts_before_sharding_and_trains_near_fp32(fp8_on_cpu: Any,
                                                                  checkpointing: bool) -> None:
    import meshtrain_runtime as mr

    mr.init({"activation_checkpointing": checkpointing})
    reference = _train(mr.transform(_llama()))
    mr.reset()
    mr.init({"fp8": True, "activation_checkpointing": checkpointing})
    model = mr.transform(_llama())
    assert len(_float8_names(model)) == 14
    assert _float8_names(model.model.layers[0]) != []  # inside the FSDP (and checkpoint) units
    losses = _train(model)
    # e4m3 keeps 3 mantissa bits: each matmul operand is off by up to 2^-4 relatively, and the
    # errors average out over the dot products. The first loss is the forward's rounding alone
    # (measured 4e-5 relative); later ones carry Adam's amplified response to float8 gradients
    # (measured up to 0.4 % at lr 1e-2).
    assert losses[0] == pytest.approx(reference[0], rel=1e-3)
    assert losses == pytest.approx(reference, rel=1e-2)
    assert losses != reference  # float8 really ran
    assert losses[-1] < 0.9 * losses[0]
