"""Encoder-decoder models: the dispatch over their families, and what they share.

Families ``t5`` (meshtrain.plan.t5) and ``bart`` (meshtrain.plan.bart): ``num_layers`` encoder
blocks then ``num_decoder_layers`` decoder blocks with cross-attention. The encoder reads
``seq_len`` tokens, the decoder ``decoder_seq_len`` (labels) tokens. Each family module gives
its parameter tensors, the parameters of one encoder and one decoder block, what one block and
the model save for backward, and ModelSpec fields from its ``config.json``; this module picks
the family and holds what does not depend on it (layout checks, checkpointed blocks, FLOPs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.bart import (
    bart_block_params,
    bart_groups,
    bart_layer_terms,
    bart_model_terms,
    from_bart_config,
)
from meshtrain.plan.spec import ModelShape, ParamGroup
from meshtrain.plan.t5 import (
    from_t5_config,
    t5_block_params,
    t5_groups,
    t5_layer_terms,
    t5_model_terms,
)

_GROUPS: dict[str, Callable[..., list[ParamGroup]]] = {"t5": t5_groups, "bart": bart_groups}
_BLOCK_PARAMS: dict[str, Callable[[ModelShape], tuple[int, int]]] = {
    "t5": t5_block_params, "bart": bart_block_params}
_LAYER_TERMS: dict[str, Callable[..., dict[str, float]]] = {
    "t5": t5_layer_terms, "bart": bart_layer_terms}
_MODEL_TERMS: dict[str, Callable[..., dict[str, float]]] = {
    "t5": t5_model_terms, "bart": bart_model_terms}
CONFIG_MODEL_TYPES: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "t5": from_t5_config, "mt5": from_t5_config, "bart": from_bart_config}
"""HF ``model_type`` -> the family's ``config.json`` reader."""


def encdec_groups(model: ModelShape, *, decoder_block_only: bool = False) -> list[ParamGroup]:
    """Every parameter tensor of an encoder-decoder model (or those of one decoder block)."""
    return _GROUPS[model.family](model, decoder_block_only=decoder_block_only)


def layer_terms(model: ModelShape, b: int, s_enc: int, s_dec: int, c: int, *,
                decoder: bool) -> dict[str, float]:
    """One encoder (or decoder) block's saved bytes, by tensor (the family module's docstring)."""
    return _LAYER_TERMS[model.family](model, b, s_enc, s_dec, c, decoder=decoder)


def model_terms(model: ModelShape, b: int, s_enc: int, s_dec: int, c: int) -> dict[str, float]:
    """Bytes saved once per model, by tensor (the family module's docstring)."""
    return _MODEL_TERMS[model.family](model, b, s_enc, s_dec, c)


def from_encdec_config(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """ModelSpec fields from the ``config.json`` of a model type in CONFIG_MODEL_TYPES."""
    return CONFIG_MODEL_TYPES[model_type](config)


def check_layout(model: ModelShape, *, tensor_parallel_degree: int,
                 context_parallel_degree: int) -> None:
    """The runtime shards encoder-decoder blocks with FSDP2 (and checkpoints them), but has no
    tensor- or context-parallel plan for them: HF's T5 and BART have no ``base_model_tp_plan``."""
    if tensor_parallel_degree > 1 or context_parallel_degree > 1:
        raise ConfigError(
            f"{model.name} is an encoder-decoder model: meshtrain's runtime shards its blocks "
            f"with FSDP but has no tensor- or context-parallel plan for them (HF's "
            f"{model.family.upper()} has no base_model_tp_plan); tensor_parallel_degree="
            f"{tensor_parallel_degree}, context_parallel_degree={context_parallel_degree}. "
            "Use 1 for both and shard (hybrid_shard_degree) instead."
        )


def encdec_flops(model: ModelShape, training: Any, tokens_enc: float, tokens_dec: float,
                 recompute_fraction: float) -> float:
    """Training FLOPs of one micro-batch: (6 + 2 x recomputed fraction) x parameters x the
    tokens that pass them (encoder blocks: encoder tokens; decoder blocks and the head:
    decoder tokens) plus attention (12 x width x keys per query and layer)."""
    enc_block, dec_block = _BLOCK_PARAMS[model.family](model)
    head = model.vocab_size * model.hidden_size
    factor = 6 + 2 * recompute_fraction
    w = model.num_attention_heads * model.attention_head_dim
    s_enc, s_dec = training.seq_len, decoder_seq_len(model, training)
    enc = (factor * enc_block + 12 * w * s_enc) * model.num_layers * tokens_enc
    dec = (factor * dec_block + 12 * w * (s_dec + s_enc)) * model.num_decoder_layers * tokens_dec
    return enc + dec + 6 * head * tokens_dec


def decoder_seq_len(model: ModelShape, training: Any) -> int:
    """The tokens the output head and the loss see: the decoder's for an encoder-decoder."""
    if model.num_decoder_layers and training.decoder_seq_len:
        return int(training.decoder_seq_len)
    return int(training.seq_len)


def checkpointed_blocks(model: ModelShape, interval: int) -> tuple[int, int]:
    """(encoder, decoder) blocks checkpointed: blocks 0, n, 2n, ... of encoder then decoder."""
    enc = math.ceil(model.num_layers / interval)
    total = math.ceil(model.num_blocks / interval)
    return enc, total - enc


__all__ = ["CONFIG_MODEL_TYPES", "check_layout", "checkpointed_blocks", "decoder_seq_len",
           "encdec_flops", "encdec_groups", "from_encdec_config", "layer_terms", "model_terms"]
