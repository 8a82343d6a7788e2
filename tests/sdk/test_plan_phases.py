"""The per-phase memory model: H100 measurements, what is live when, offload, optimizers."""

from __future__ import annotations

import dataclasses

import pytest

from meshtrain import ConfigError
from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan import PRESETS, Training, build_cluster, estimate_layout, preflight
from meshtrain.plan.phases import PHASES, fsdp_groups

GIB = 2**30
# FSDP2 rank 0 of 8 (one p4d/p5-like host), bf16 parameters / fp32 reduction, foreach AdamW,
# micro-batch 1, no activation checkpointing; peak = torch.cuda.max_memory_allocated (issue 21).
# Shapes: Llama-2-7B hidden 4096, 32 heads, intermediate 11008, vocab 32000; Llama-3-8B hidden
# 4096, 32 / 8 heads, intermediate 14336, vocab 128256 (the presets).
H100_MEASURED = [
    ("llama2-7b", 32, 4096, 34.13),
    ("llama2-7b", 4, 4096, 6.18),
    ("llama3-8b", 2, 8192, 18.12),
]
CLUSTER = build_cluster(gpus=8, gpu_memory_gib=80)


def _estimate(name: str, layers: int | None = None, *, seq_len: int = 4096,
              training: Training | None = None, **parameters):
    model = PRESETS[name]
    if layers is not None:
        model = model.model_copy(update={"num_layers": layers})
    training = training or Training(seq_len=seq_len, precision="bf16")
    return estimate_layout(model, SMPParameters(**parameters), CLUSTER, training)


@pytest.mark.parametrize(("name", "layers", "seq_len", "measured_gib"), H100_MEASURED)
def test_h100_peaks_within_5_percent(name, layers, seq_len, measured_gib):
    estimate = _estimate(name, layers, seq_len=seq_len)
    assert estimate.memory.peak_bytes / GIB == pytest.approx(measured_gib, rel=0.05)
    # All three peak in the loss: the fp32 log-softmax, its gradient and the logits' gradient.
    assert estimate.memory.peak_phase.name == "loss"


def test_phases_are_in_order_and_the_peak_is_the_largest():
    memory = _estimate("llama2-7b", 4).memory
    assert tuple(phase.name for phase in memory.phases) == PHASES
    assert memory.peak_bytes == max(phase.total for phase in memory.phases)


def test_no_gradients_before_backward():
    """zero_grad(set_to_none=True): no gradient exists in forward or at the loss."""
    phases = {p.name: p for p in _estimate("llama2-7b", 4).memory.phases}
    for name in ("forward", "loss"):
        assert "sharded_gradients" not in phases[name].terms
        assert "unsharded_gradients" not in phases[name].terms
    step = phases["optimizer_step"].terms
    assert step["sharded_gradients"] == step["sharded_parameters"]  # fp32 grad per fp32 shard


def test_foreach_adamw_step_buffer_and_fused():
    foreach = {p.name: p for p in _estimate("llama2-7b", 4).memory.phases}
    fused = {p.name: p for p in _estimate(
        "llama2-7b", 4, training=Training(fused_optimizer=True)).memory.phases}
    buffer = foreach["optimizer_step"].terms["optimizer_step_buffer"]
    assert buffer == foreach["optimizer_step"].terms["sharded_parameters"]  # 4 B per local param
    assert fused["optimizer_step"].terms["optimizer_step_buffer"] == 0
    assert fused["loss"].total == foreach["loss"].total


def test_loss_temporaries_are_the_worse_of_the_loss_forward_and_its_first_backward():
    tv = 8192 * 128256
    long = _estimate("llama3-8b", 2, seq_len=8192).memory.phases[1].terms
    # Backward's first kernels: two fp32 [tokens, vocab] gradients beside the log-softmax.
    assert long["loss_temporaries"] == 2 * 4 * tv
    short = _estimate("llama3-8b", 2, seq_len=2048).memory.phases[1].terms
    # Shorter: the forward moment (bf16 logits + fp32 copy, the head's flat all-gather buffer
    # still held) is the worse one.
    assert short["loss_temporaries"] == (2 + 4) * tv // 4


def test_shard_grad_op_keeps_every_group_gathered():
    full = {p.name: p for p in _estimate("llama2-7b", 8).memory.phases}
    zero2 = {p.name: p for p in _estimate("llama2-7b", 8,
                                          sharding_strategy="shard_grad_op").memory.phases}
    model = PRESETS["llama2-7b"].model_copy(update={"num_layers": 8})
    groups = fsdp_groups(model, resolve_degrees(SMPParameters(), 8))
    # the forward ends in the head's pre-forward: zero2 still holds the embedding and every
    # block (bf16) beside the root and the head (unsharded, and its flat all-gather buffer)
    assert zero2["forward"].terms["gathered_parameters"] == 2 * (
        groups.root + 2 * groups.head + groups.embedding + 8 * groups.block)
    assert zero2["forward"].total > full["forward"].total
    assert zero2["backward"].total > full["backward"].total


def test_cpu_offload_moves_states_and_step_to_host():
    offloaded = {p.name: p for p in _estimate("llama2-7b", 4, cpu_offload=True).memory.phases}
    for phase in offloaded.values():
        assert phase.terms["sharded_parameters"] == phase.terms["optimizer_states"] == 0
    # on the GPU only the loss the loop still holds: one 512-byte block of the caching allocator
    assert offloaded["optimizer_step"].total == 512
    assert offloaded["loss"].terms["gathered_parameters"] > 0  # unsharded buffers stay on GPU


def test_optimizer_only_offload_keeps_parameters_and_gradients():
    training = Training(optimizer_offload=True)
    phases = {p.name: p for p in _estimate("llama2-7b", 4, training=training).memory.phases}
    step = phases["optimizer_step"].terms
    assert step["optimizer_states"] == step["optimizer_step_buffer"] == 0
    assert step["sharded_parameters"] == step["sharded_gradients"] > 0


def test_checkpointing_trades_activations_for_a_recomputed_block():
    plain = _estimate("llama2-7b", 8).memory
    ckpt = _estimate("llama2-7b", 8, activation_checkpointing=True).memory
    assert ckpt.peak_bytes < plain.peak_bytes
    backward = ckpt.phases[2].terms
    assert backward["recomputed_activations"] > 0


def test_largest_layer_input_sizes_the_gathered_blocks():
    model = PRESETS["llama2-7b"]
    bigger = model.model_copy(update={"largest_layer_params": 2 * 202_383_360})
    degrees = resolve_degrees(SMPParameters(), 8)
    assert fsdp_groups(bigger, degrees).block == 2 * fsdp_groups(model, degrees).block


def test_tied_embedding_stays_in_the_root_group():
    tied = PRESETS["llama2-7b"].model_copy(update={"tie_word_embeddings": True})
    groups = fsdp_groups(tied, resolve_degrees(SMPParameters(), 8))
    assert groups.embedding == 0 and groups.head == 0
    assert groups.root == 32000 * 4096 + 4096


def test_expert_parallel_experts_form_their_own_groups():
    model = PRESETS["mixtral-8x7b"]
    plain = fsdp_groups(model, resolve_degrees(SMPParameters(), 8))
    ep = fsdp_groups(model, resolve_degrees(SMPParameters(expert_parallel_degree=2), 8))
    assert plain.experts == 0 and ep.experts > 0
    # ep 2 keeps half the experts per rank: the block and its experts gather half the experts.
    assert ep.block_total < plain.block_total


def _smp(**parameters) -> dict:
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


def test_refusal_names_the_phase_and_the_term_that_tips_it():
    """Llama-2-7B fully sharded on 30 GiB GPUs: the loss phase (34.0 GiB) does not fit in
    27.5 GiB usable; without its activations (23.4 GiB) it would: they tip it."""
    with pytest.raises(ConfigError) as error:
        preflight(_smp(), model="llama2-7b", instance_type="ml.p4d.24xlarge", gpu_memory_gib=30)
    message = str(error.value)
    assert "peak in the loss phase" in message
    assert "what tips it: activations (23.4 GiB in the loss phase)" in message


def test_refusal_names_the_step_buffer_when_it_tips_the_optimizer_step():
    """Llama-2-70B over 32 A100s with checkpointing: the optimizer step peaks, and foreach
    AdamW's fp32 temporary (as large as the sharded parameters) is what tips it."""
    with pytest.raises(ConfigError) as error:
        preflight(_smp(activation_checkpointing=True), model="llama2-70b",
                  instance_type="ml.p4d.24xlarge", instance_count=4)
    message = str(error.value)
    assert "peak in the optimizer step phase" in message
    assert "what tips it: optimizer step buffer" in message and "fused=True" in message
    # Fused AdamW needs no step buffer, so the optimizer step fits; the end of backward does
    # not: every group's sharded fp32 gradient is there beside the last block's buffers.
    with pytest.raises(ConfigError) as fused:
        preflight(_smp(activation_checkpointing=True), model="llama2-70b",
                  instance_type="ml.p4d.24xlarge", instance_count=4, fused_optimizer=True)
    assert "peak in the backward phase" in str(fused.value)
    assert "optimizer step buffer" not in str(fused.value)
    plan = preflight(_smp(activation_checkpointing=True), model="llama2-70b",
                     instance_type="ml.p4d.24xlarge", instance_count=5, fused_optimizer=True)
    assert plan.candidates[0].fits


def test_p4d_verdict_flips_to_fits():
    """Issue 21: fully sharded on one p4d measured 34.13 GiB, under the 37 GiB usable."""
    plan = preflight(_smp(mixed_precision="bf16"), model="llama2-7b",
                     instance_type="ml.p4d.24xlarge")
    assert plan.candidates[0].fits


def test_training_is_frozen_with_the_new_fields():
    training = Training(optimizer_offload=True)
    assert dataclasses.replace(training, fused_optimizer=True).optimizer_offload
