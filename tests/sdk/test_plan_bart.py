"""BART in the planner (family ``bart``): shapes, saved activations, config.json, CLI.

Hand-computed expectations use a tiny BART (d_model 64, 4 heads, ffn 160, 2 + 2 blocks,
vocabulary 128, 64 positions, batch 2, encoder 24 tokens, decoder 16), and the real
``BartForConditionalGeneration`` of that config measures what autograd saves (one process, CPU;
the planner itself never imports torch).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from meshtrain import ConfigError
from meshtrain.contract import SMPParameters
from meshtrain.plan import (
    PRESETS,
    Training,
    activation_bytes,
    build_cluster,
    estimate_layout,
    resolve_model,
)
from meshtrain.plan.bart import bart_block_params
from meshtrain.plan.cli import plan_main
from meshtrain.plan.models import param_groups
from meshtrain.plan.phases import fsdp_groups
from meshtrain_runtime.diagnostics.memory import SavedActivationMeter

B, S_ENC, S_DEC = 2, 24, 16


def _config(**overrides: Any) -> BartConfig:
    shape = {"d_model": 64, "encoder_ffn_dim": 160, "decoder_ffn_dim": 160,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_layers": 2,
             "decoder_layers": 2, "vocab_size": 128, "max_position_embeddings": 64,
             "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
             "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
             "decoder_start_token_id": 2}
    return BartConfig(**{**shape, **overrides})


def _spec(config: BartConfig, attention: str = "sdpa"):
    return resolve_model({**config.to_dict(), "_attn_implementation": attention})


def _saved_bytes(config: BartConfig, attention: str = "sdpa",
                 dtype: torch.dtype = torch.float32) -> int:
    """Distinct non-parameter storages autograd saves in one training step (the runtime's
    SavedActivationMeter). In 16-bit the parameters are cast and the
    ``final_logits_bias`` buffer stays fp32, as under FSDP2's mixed precision."""
    torch.manual_seed(0)
    config._attn_implementation = attention
    model = BartForConditionalGeneration(config).train().to(dtype)
    model.final_logits_bias = model.final_logits_bias.float()
    meter = SavedActivationMeter(parameters=model.parameters())

    ids = torch.randint(3, 128, (B, S_ENC), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(3, 128, (B, S_DEC), generator=torch.Generator().manual_seed(1))
    with meter:
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
    loss.backward()
    return meter.result.bytes


def _estimate(config: BartConfig, attention: str = "sdpa", precision: str = "fp32", **kw):
    return activation_bytes(_spec(config, attention), seq_len=S_ENC, micro_batch=B,
                            precision=precision, decoder_seq_len=S_DEC, **kw)


def _counted(spec) -> Counter:
    planned: Counter = Counter()
    for group in param_groups(spec):
        planned[group.shape] += group.count
    return planned


def test_presets_are_the_published_counts():
    """facebook/bart-base and facebook/bart-large (the shared embedding counted once;
    final_logits_bias is a buffer)."""
    assert PRESETS["bart-base"].num_params == 139_420_416
    assert PRESETS["bart-large"].num_params == 406_291_456


@pytest.mark.parametrize("name", ["bart-base", "bart-large"])
def test_presets_match_hf_models_on_meta(name):
    spec = PRESETS[name]
    config = BartConfig(d_model=spec.hidden_size, encoder_layers=spec.num_layers,
                        decoder_layers=spec.num_decoder_layers,
                        encoder_attention_heads=spec.num_attention_heads,
                        decoder_attention_heads=spec.num_attention_heads,
                        encoder_ffn_dim=spec.intermediate_size,
                        decoder_ffn_dim=spec.intermediate_size, vocab_size=spec.vocab_size,
                        max_position_embeddings=spec.max_position_embeddings)
    with torch.device("meta"):
        model = BartForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    assert _counted(spec) == Counter(tuple(p.shape) for p in model.parameters())
    encoder_block = sum(p.numel() for p in model.model.encoder.layers[0].parameters())
    decoder_block = sum(p.numel() for p in model.model.decoder.layers[0].parameters())
    assert bart_block_params(spec) == (encoder_block, decoder_block)


def test_parameters_equal_a_real_hf_bart():
    """A real BartForConditionalGeneration: 200,832 parameters (the shared embedding counted
    once; ``max_position_embeddings + 2`` rows in each stack's positional embedding)."""
    config = _config()
    model = BartForConditionalGeneration(config)
    spec = _spec(config)
    assert spec.num_params == sum(p.numel() for p in model.parameters()) == 200_832
    assert _counted(spec) == Counter(tuple(p.shape) for p in model.parameters())


@pytest.mark.parametrize(("overrides", "attention", "per_encoder", "per_decoder"), [
    ({}, "sdpa", 161_280, 165_632),
    ({}, "eager", 178_944, 185_088),
    ({"activation_function": "relu"}, "sdpa", 130_560, 145_152),
])
def test_activations_match_hf_bart_to_the_byte(overrides, attention, per_encoder, per_decoder):
    """fp32, no dropout. By hand (T = 48 encoder, 32 decoder tokens; h = 64, i = 160): an
    encoder block is 2 LayerNorms (4Th + 8T) + 2 projection inputs + q, k, v, out (4Th each)
    + SDPA's log-sum-exp (4 b a s = 768) + GELU's input and output (2 x 4Ti) = 161,280; a
    decoder block adds a third norm and input, cross q and out, k and v over the 24 encoder
    tokens (24,576) and a second log-sum-exp (512 each): 165,632. Eager attention keeps the
    softmax instead of the log-sum-exp; ReLU only its output."""
    config = _config(**overrides)
    estimate = _estimate(config, attention)
    assert estimate.encoder_layer_bytes == per_encoder
    assert estimate.layer_bytes == per_decoder
    assert estimate.total_bytes == _saved_bytes(config, attention)


@pytest.mark.parametrize(("overrides", "attention"), [
    ({"dropout": 0.1}, "sdpa"),
    ({"activation_dropout": 0.1}, "sdpa"),
    ({"activation_dropout": 0.1, "activation_function": "relu"}, "sdpa"),
    ({"dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1}, "eager"),
])
def test_dropout_masks_are_where_hf_bart_saves_them(overrides, attention):
    """The plan counts CUDA's fused dropout (a 1-byte mask per element). On CPU dropout is
    not fused and saves its mask in the compute dtype (4 bytes here), so the CPU measures the
    plan plus 3 bytes per masked element; everything else is unchanged."""
    config = _config(**overrides)
    estimate = _estimate(config, attention)
    masks = (estimate.num_layers * estimate.layer_terms["dropout_masks"]
             + estimate.num_encoder_layers * estimate.encoder_layer_terms["dropout_masks"]
             + estimate.model_terms.get("embedding_dropout_mask", 0))
    assert masks > 0
    assert estimate.total_bytes + 3 * masks == _saved_bytes(config, attention)


def test_bf16_logits_are_promoted_to_fp32_by_the_final_logits_bias():
    """bf16 parameters, fp32 final_logits_bias (FSDP2 casts parameters, not buffers): the loss
    keeps the fp32 log-softmax. The CPU's LayerNorm keeps its mean and rstd in bf16 where CUDA
    keeps them in fp32: the CPU measures 2 x 2 bytes less per token and norm (5 norms over the
    48 encoder tokens, 7 over the 32 decoder tokens: 1,856 bytes)."""
    config = _config()
    estimate = _estimate(config, precision="bf16")
    assert estimate.model_terms["logits_fp32"] == 4 * B * S_DEC * 128
    norm_tokens = (2 * 2 + 1) * B * S_ENC + (3 * 2 + 1) * B * S_DEC
    assert estimate.total_bytes - 4 * norm_tokens == _saved_bytes(config, dtype=torch.bfloat16)


def test_checkpointing_keeps_block_inputs_of_both_stacks():
    estimate = _estimate(_config(), recompute="full")
    assert (estimate.encoder_checkpointed, estimate.num_checkpointed) == (2, 2)
    blocks = 2 * 4 * B * S_ENC * 64 + 2 * 4 * B * S_DEC * 64
    assert estimate.total_bytes == blocks + sum(estimate.model_terms.values())


def test_config_json_file_and_its_refusals(tmp_path):
    _config(dropout=0.1).save_pretrained(tmp_path)
    spec = resolve_model(tmp_path / "config.json")
    assert (spec.family, spec.ffn, spec.num_decoder_layers, spec.hidden_dropout) == \
        ("bart", "gelu", 2, 0.1)
    assert spec.num_params == sum(p.numel() for p in BartForConditionalGeneration(
        _config()).parameters())
    with pytest.raises(ConfigError, match="decoder_attention_heads"):
        resolve_model(_config(decoder_attention_heads=2).to_dict())
    with pytest.raises(ConfigError, match="activation_function='gelu_new'"):
        resolve_model(_config(activation_function="gelu_new").to_dict())
    with pytest.raises(ConfigError, match="tie_word_embeddings"):
        resolve_model(_config(tie_word_embeddings=False).to_dict())


def test_fsdp_groups_keep_embeddings_in_the_root():
    """`shared` is tied into both stacks and the head; the positional embeddings and the
    embedding norms are outside the blocks: all in the root (rows padded by FSDP2 to a
    multiple of the 8 ranks: 50265 -> 50272, 1026 -> 1032). A decoder block is the largest."""
    spec = PRESETS["bart-large"]
    degrees = estimate_layout(spec, SMPParameters(), build_cluster(gpus=8), Training()).degrees
    groups = fsdp_groups(spec, degrees)
    h = 1024
    assert groups.root == 50272 * h + 2 * 1032 * h + 4 * h
    assert groups.block == bart_block_params(spec)[1]
    assert groups.embedding == 0 and groups.head == 0 and groups.num_blocks == 24


def test_tensor_parallel_is_refused():
    with pytest.raises(ConfigError, match="no tensor- or context-parallel plan"):
        estimate_layout(PRESETS["bart-large"], SMPParameters(tensor_parallel_degree=2),
                        build_cluster(gpus=8), Training())


def _plan(argv: list[str], capsys) -> dict:
    assert plan_main([*argv, "--gpus", "8", "--seq-len", "1024", "--decoder-seq-len", "256",
                      "--json", "--top", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_preset_config_and_dimensions(tmp_path, capsys):
    preset = _plan(["--model", "bart-large"], capsys)
    assert preset["model"]["family"] == "bart" and preset["model"]["num_decoder_layers"] == 12
    assert preset["model"]["num_params"] == 406_291_456
    custom = _plan(["--family", "bart", "--hidden-size", "1024", "--num-layers", "12",
                    "--num-decoder-layers", "12", "--num-heads", "16", "--intermediate-size",
                    "4096", "--dropout", "0.1"], capsys)
    assert custom["model"]["num_params"] == 406_291_456
    assert custom["recommendation"]["memory_bytes"] == preset["recommendation"]["memory_bytes"]
    _config().save_pretrained(tmp_path)
    assert _plan(["--model", str(tmp_path)], capsys)["model"]["family"] == "bart"
