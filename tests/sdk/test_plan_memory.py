"""Model-state bytes: conventions, ZeRO stages, TP/EP/FSDP sharding, with hand arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtrain import ConfigError
from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan.memory import (
    Training,
    bytes_per_param,
    group_shard_elements,
    local_param_elements,
    model_state_bytes,
    optimizer_step_bytes,
    zero_stage_bytes,
)
from meshtrain.plan.models import ModelSpec, ParamGroup, llama_shaped

TINY = ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=160, vocab_size=128)


@pytest.mark.parametrize(("precision", "optimizer", "convention", "expected"), [
    ("bf16", "adamw", "zero", (2, 2, 12)),   # ZeRO: fp16 params, fp16 grads, K = 12
    ("bf16", "adamw", "smp", (2, 6, 12)),    # SMP's guide: + an fp32 gradient copy = 20
    ("fp32", "adamw", "zero", (4, 4, 8)),
    ("fp32", "adamw", "smp", (4, 4, 8)),
    ("bf16", "sgd", "zero", (2, 2, 4)),      # only the fp32 master copy
    ("fp32", "sgd_momentum", "zero", (4, 4, 4)),
])
def test_bytes_per_param(precision, optimizer, convention, expected):
    per = bytes_per_param(Training(precision=precision, optimizer=optimizer,
                                   convention=convention))
    assert (per.parameters, per.gradients, per.optimizer_states) == expected


def test_zero_stages_by_hand():
    model = llama_shaped(1e9)  # exactly 1e9 parameters, 8 data-parallel GPUs
    zero = zero_stage_bytes(model, 8, Training(convention="zero"))
    assert zero == {"data_parallel_degree": 8, "ddp": 16e9, "zero1": 4e9 + 12e9 / 8,
                    "zero2": 2e9 + 14e9 / 8, "zero3": 16e9 / 8}
    smp = zero_stage_bytes(model, 8, Training(convention="smp"))
    assert (smp["ddp"], smp["zero1"], smp["zero2"], smp["zero3"]) == (
        20e9, 8e9 + 1.5e9, 2e9 + 18e9 / 8, 2.5e9)


@pytest.mark.parametrize(("group", "tp", "ep", "shard", "expected"), [
    (ParamGroup("w", (10, 4)), 1, 1, 4, 3 * 4),              # FSDP2 pads: ceil(10/4) rows
    (ParamGroup("w", (10, 4), tp_dim=0), 2, 1, 4, 2 * 4),     # colwise: (5, 4), ceil(5/4) = 2
    (ParamGroup("w", (10, 4), tp_dim=1), 2, 1, 4, 3 * 2),     # rowwise: (10, 2), 3 rows
    # Experts as the runtime's shard_experts_with_fsdp places them: dim 1 when it divides by
    # the shard / ep ranks, else dim 0 (padded).
    (ParamGroup("e", (8, 6, 4), expert=True), 1, 2, 8, 1 * 6 * 4),   # 6 % 4: 4 experts / 4 ranks
    (ParamGroup("e", (8, 6, 4), expert=True), 1, 1, 16, 1 * 6 * 4),  # 6 % 16: ceil(8/16) = 1
    (ParamGroup("e", (8, 16, 4), expert=True), 1, 2, 8, 4 * 4 * 4),  # dim 1: 16 / 4 ranks
])
def test_group_shard_elements(group, tp, ep, shard, expected):
    assert group_shard_elements(group, tp=tp, ep=ep, shard=shard) == expected


def test_tiny_llama_tp2_shard2_by_hand():
    # Per layer: q (64,64) col -> (32,64) -> 16 rows: 1024; k, v (32,64) -> (16,64) -> 512 each;
    # o (64,64) row -> (64,32) -> 32 rows: 1024; two norms 32 each; gate, up (160,64) col ->
    # (80,64) -> 40 rows: 2560 each; down (64,160) row -> (64,80) -> 2560. Layer: 10816.
    # Embedding (128,64) vocab-parallel (the runtime's TP splits it over the vocabulary) ->
    # (64,64) -> 32 rows: 2048; final norm 32; lm_head col: 2048.
    elements = 2 * 10816 + 2048 + 32 + 2048
    assert local_param_elements(TINY, tensor_parallel_degree=2, shard_degree=2) == elements
    degrees = resolve_degrees(SMPParameters(hybrid_shard_degree=2, tensor_parallel_degree=2), 4)
    states = model_state_bytes(TINY, degrees, Training())
    assert (states.parameters, states.gradients, states.optimizer_states) == (
        2 * elements, 2 * elements, 12 * elements)
    assert states.total == 16 * 25760


def test_no_shard_holds_everything_and_cpu_offload_nothing():
    degrees = resolve_degrees(SMPParameters(hybrid_shard_degree=1), 8)
    assert model_state_bytes(TINY, degrees, Training()).total == 16 * TINY.num_params
    assert model_state_bytes(TINY, degrees, Training(), cpu_offload=True).total == 0


def test_optimizer_step_buffer_is_one_fp32_copy_unless_fused():
    degrees = resolve_degrees(SMPParameters(hybrid_shard_degree=8), 8)
    shard = local_param_elements(TINY, shard_degree=8)
    assert optimizer_step_bytes(TINY, degrees, Training()) == 4 * shard
    assert optimizer_step_bytes(TINY, degrees, Training(fused_optimizer=True)) == 0
    assert optimizer_step_bytes(TINY, degrees, Training(optimizer="sgd")) == 0


@settings(max_examples=60, deadline=None)
@given(heads=st.sampled_from([4, 8, 16]), kv_div=st.sampled_from([1, 2, 4]),
       layers=st.integers(1, 4), shard=st.sampled_from([1, 2, 4, 8, 16]),
       tp=st.sampled_from([1, 2, 4]))
def test_sharding_partitions_the_model(heads, kv_div, layers, shard, tp):
    """With every dim divisible, the ranks of one TP x shard grid hold the model exactly once
    (TP-replicated tensors once per TP rank), and more sharding never holds more."""
    model = ModelSpec(name="p", hidden_size=32 * heads, num_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads // kv_div,
                      intermediate_size=64 * heads, vocab_size=256)
    kv = model.num_key_value_heads
    if kv % tp:
        return
    replicated = model.hidden_size * (2 * layers + 1)  # the norms (the embedding is split)
    per_rank = local_param_elements(model, tensor_parallel_degree=tp, shard_degree=shard)
    assert per_rank * shard * tp == model.num_params + (tp - 1) * replicated
    more = local_param_elements(model, tensor_parallel_degree=tp, shard_degree=2 * shard)
    assert more <= per_rank


@pytest.mark.parametrize("bad", [{"precision": "int8"}, {"optimizer": "lion"},
                                 {"convention": "deepspeed"}, {"seq_len": 0},
                                 {"compute_efficiency": 1.5}])
def test_bad_training_settings(bad):
    with pytest.raises(ConfigError):
        Training(**bad)
