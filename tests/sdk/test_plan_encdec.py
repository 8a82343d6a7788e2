"""Encoder-decoder models (T5 / Flan-T5) in the planner: shapes, activations, phases, CLI.

Hand-computed expectations use a tiny T5 (d_model 64, d_ff 160, 4 heads of d_kv 16, 2 + 2
blocks, vocabulary 128, batch 2, encoder 24 tokens, decoder 16), and the real
``T5ForConditionalGeneration`` of that config measures what autograd saves (one process, fp32,
the planner itself never imports torch).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from meshtrain import ConfigError
from meshtrain.contract import SMPParameters
from meshtrain.plan import (
    PRESETS,
    Training,
    activation_bytes,
    build_cluster,
    estimate_layout,
    plan_layouts,
    resolve_model,
)
from meshtrain.plan.cli import plan_main
from meshtrain.plan.models import param_groups
from meshtrain.plan.phases import fsdp_groups
from meshtrain_runtime.diagnostics.memory import SavedActivationMeter

B, S_ENC, S_DEC = 2, 24, 16


def _config(**overrides) -> T5Config:
    shape = {"d_model": 64, "d_ff": 160, "d_kv": 16, "num_heads": 4, "num_layers": 2,
             "num_decoder_layers": 2, "vocab_size": 128, "decoder_start_token_id": 0,
             "pad_token_id": 0, "dropout_rate": 0.0, "feed_forward_proj": "relu"}
    return T5Config(**{**shape, **overrides})


def _saved_bytes(config: T5Config) -> int:
    """Distinct non-parameter storages autograd saves in one training step (the runtime's
    SavedActivationMeter)."""
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).train()
    meter = SavedActivationMeter(parameters=model.parameters())

    ids = torch.randint(0, 128, (B, S_ENC), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 128, (B, S_DEC), generator=torch.Generator().manual_seed(1))
    with meter:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    return meter.result.bytes


def _estimate(config: T5Config, **kw):
    return activation_bytes(resolve_model(config.to_dict()), seq_len=S_ENC, micro_batch=B,
                            precision="fp32", decoder_seq_len=S_DEC, **kw)


def test_presets_are_the_published_counts():
    """T5's and Flan-T5's published parameter counts (tied embeddings counted once)."""
    assert PRESETS["t5-3b"].num_params == 2_851_598_336
    assert PRESETS["t5-11b"].num_params == 11_307_321_344
    assert PRESETS["flan-t5-xl"].num_params == 2_849_757_184


@pytest.mark.parametrize("name", ["t5-3b", "flan-t5-xl"])
def test_presets_match_hf_models_on_meta(name):
    spec = PRESETS[name]
    config = T5Config(d_model=spec.hidden_size, d_ff=spec.intermediate_size,
                      d_kv=spec.attention_head_dim, num_heads=spec.num_attention_heads,
                      num_layers=spec.num_layers, num_decoder_layers=spec.num_decoder_layers,
                      vocab_size=spec.vocab_size, tie_word_embeddings=spec.tie_word_embeddings,
                      feed_forward_proj="gated-gelu" if spec.ffn == "gated_gelu" else "relu")
    with torch.device("meta"):
        model = T5ForConditionalGeneration(config)
    # transformers 5 always ties T5's head to `shared` (its config forces
    # tie_word_embeddings=True); Flan-T5's checkpoints, and the planner, keep it separate.
    untied_head = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    assert sum(p.numel() for p in model.parameters()) + untied_head == spec.num_params
    planned: Counter = Counter()
    for group in param_groups(spec):
        if group.name != "lm_head":
            planned[group.shape] += group.count
    assert planned == Counter(tuple(p.shape) for p in model.parameters())


@pytest.mark.parametrize(("overrides", "per_encoder", "per_decoder"), [
    ({}, 172_416, 177_280),
    ({"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, 356_736, 300_160),
])
def test_activations_match_hf_t5_to_the_byte(overrides, per_encoder, per_decoder):
    """fp32, no dropout. By hand (T = 48 encoder, 32 decoder tokens; w = 64): an encoder block
    is 2 norms (4Th + 4T + 4Th) + 2 projection inputs + q, k, v, out (4Tw each) + the softmax
    (4 b a s^2 = 18,432) + relu (4 T i) = 172,416; a decoder block adds a third norm and input,
    cross q and out, k and v over the 24 encoder tokens (24,576), SDPA's log-sum-exp
    (4 b a 16 = 512) and the causal mask (256): 177,280. Gated-gelu saves 7 x 4 T i."""
    config = _config(**overrides)
    estimate = _estimate(config)
    assert estimate.encoder_layer_bytes == per_encoder
    assert estimate.layer_bytes == per_decoder
    assert estimate.total_bytes == _saved_bytes(config)


def test_decoder_length_changes_only_what_the_decoder_saves():
    config = _config()
    longer = _estimate(config)
    shorter = activation_bytes(resolve_model(config.to_dict()), seq_len=S_ENC, micro_batch=B,
                               precision="fp32", decoder_seq_len=8)
    assert longer.encoder_layer_bytes == shorter.encoder_layer_bytes
    assert longer.layer_terms["cross_attention_kv"] == shorter.layer_terms["cross_attention_kv"]
    assert longer.layer_bytes > shorter.layer_bytes


def test_checkpointing_keeps_block_inputs_of_both_stacks():
    estimate = _estimate(_config(), recompute="full")
    assert (estimate.encoder_checkpointed, estimate.num_checkpointed) == (2, 2)
    blocks = 2 * 4 * B * S_ENC * 64 + 2 * 4 * B * S_DEC * 64
    assert estimate.total_bytes == blocks + sum(estimate.model_terms.values())


def test_fsdp_groups_and_the_root_holding_the_shared_embedding():
    """`shared` is tied into both stacks: FSDP2 keeps it in the root; the largest block (a
    decoder block: 4 + 4 attention projections, 3 norms, relu MLP) sizes the gathered buffers."""
    spec = PRESETS["t5-3b"]
    degrees = estimate_layout(spec, SMPParameters(), build_cluster(gpus=8), Training()).degrees
    groups = fsdp_groups(spec, degrees)
    h, w, i = 1024, 32 * 128, 16384
    assert groups.block == 8 * w * h + 3 * h + 2 * i * h
    assert groups.root == 32128 * h + 2 * h and groups.embedding == 0 and groups.head == 0
    assert groups.num_blocks == 48


def test_loss_temporaries_stay_in_the_compute_dtype():
    """T5 computes the loss on bf16 logits: its log-softmax is c T V, not 4 T V."""
    training = Training(seq_len=512, decoder_seq_len=128, precision="bf16")
    estimate = estimate_layout(PRESETS["flan-t5-xl"], SMPParameters(), build_cluster(gpus=8),
                               training)
    assert estimate.activations.model_terms["log_softmax"] == 2 * 128 * 32128
    loss = {p.name: p for p in estimate.memory.phases}["loss"]
    assert loss.terms["loss_temporaries"] <= 2 * 2 * 128 * 32128


def test_tensor_parallel_is_refused_and_never_a_candidate():
    with pytest.raises(ConfigError, match="no tensor- or context-parallel plan"):
        estimate_layout(PRESETS["t5-3b"], SMPParameters(tensor_parallel_degree=2),
                        build_cluster(gpus=8), Training())
    plan = plan_layouts(PRESETS["t5-3b"], build_cluster(gpus=8), Training(seq_len=512))
    assert plan.candidates
    assert all(c.degrees.tensor_parallel_degree == 1 for c in plan.candidates)


def test_cli_preset_and_custom_description(capsys):
    assert plan_main(["--model", "t5-11b", "--gpus", "8", "--seq-len", "512",
                      "--decoder-seq-len", "128", "--json", "--top", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["num_decoder_layers"] == 24 and data["model"]["family"] == "t5"
    assert data["training"]["decoder_seq_len"] == 128
    assert plan_main(["--hidden-size", "1024", "--num-layers", "24", "--num-decoder-layers",
                      "24", "--num-heads", "32", "--head-dim", "128", "--intermediate-size",
                      "16384", "--vocab-size", "32128", "--ffn", "relu", "--tie-embeddings",
                      "--dropout", "0.1", "--gpus", "8", "--seq-len", "512", "--json",
                      "--top", "1"]) == 0
    custom = json.loads(capsys.readouterr().out)
    assert custom["model"]["num_params"] == PRESETS["t5-3b"].num_params
    assert custom["recommendation"]["memory_bytes"] == \
        _json_plan(["--model", "t5-3b", "--gpus", "8", "--seq-len", "512"], capsys)


def _json_plan(argv, capsys) -> dict:
    assert plan_main([*argv, "--json", "--top", "1"]) == 0
    return json.loads(capsys.readouterr().out)["recommendation"]["memory_bytes"]


def test_preflight_takes_the_decoder_length():
    """T5-11B with 2048 decoder tokens does not fit on 8 x 40 GiB; with 128 it does."""
    smp = {"torch_distributed": {"enabled": True},
           "smdistributed": {"modelparallel": {"enabled": True, "parameters": {}}}}
    from meshtrain.plan import preflight

    with pytest.raises(ConfigError, match="does not fit"):
        preflight(smp, model="t5-11b", instance_type="ml.p4d.24xlarge", seq_len=2048,
                  decoder_seq_len=2048, micro_batch=4)
    plan = preflight(smp, model="t5-11b", instance_type="ml.p4d.24xlarge", seq_len=512,
                     decoder_seq_len=128, micro_batch=1)
    assert plan.candidates[0].fits
