"""T5 (family ``t5``): parameters and saved activations (meshtrain.plan.encdec dispatches).

Family ``t5`` is Hugging Face's ``T5ForConditionalGeneration`` (T5 v1.0, v1.1, Flan-T5):
``num_layers`` encoder blocks (self-attention, MLP) then ``num_decoder_layers`` decoder blocks
(causal self-attention, cross-attention over the encoder's output, MLP); T5's RMS norm, no
biases, a relative position bias (``relative_attention_num_buckets`` x heads) in the first
block of each stack, ``num_heads x d_kv`` attention width (not necessarily ``d_model``). The
MLP is ``relu`` (``wi``, ``wo``) or ``gated_gelu`` (``wi_0``, ``wi_1``, ``wo``; HF's
``gelu_new``). The token embedding (``shared``) is tied into both stacks, so FSDP2 keeps it in
the root group; the output head is tied to it too unless ``tie_word_embeddings`` is false.

The encoder reads ``seq_len`` tokens, the decoder ``decoder_seq_len`` (labels) tokens.

Saved activations per block (what ``saved_tensors_hooks`` reports for HF's T5 in torch 2.13,
measured to the byte in fp32 without dropout: tests/sdk/test_plan_encdec.py), with ``T`` the
block's tokens (b s), ``w = heads x d_kv``, ``c`` compute-dtype bytes:

- each norm: fp32 input, fp32 rsqrt per token, normalised input (``4Th + 4T + cTh``; in 16-bit
  training the input in its own dtype too: T5 multiplies the input, not its fp32 copy);
- the projections' inputs (the norms' outputs), q, k, v and the attention output (``cTw`` each);
- self-attention: the relative position bias needs its gradient, so SDPA runs its math path and
  keeps the softmax (``c b heads s^2``; the decoder's causal mask, 1 byte per ``s^2``, too);
  cross-attention's bias is a constant zero tensor and SDPA keeps its fp32 log-sum-exp
  (``4 b heads s_dec``); with eager attention it keeps its softmax (``c b heads s_dec s_enc``);
- cross-attention's k and v over the encoder sequence (``2 c b s_enc w`` per decoder block);
- the MLP: relu its output (``cTi``); gated-gelu ``gelu_new``'s tanh formula, the linear branch
  and their product (7 ``cTi``);
- dropout (T5 configs default to 0.1) with a fused kernel: a 1-byte mask per element of the
  attention weights (and the dropped weights, ``c``), the attention and MLP outputs and the
  MLP's activation (and its dropped copy, which ``wo`` saves).

Once per model: token ids, the relative-position bucket indices (int64 ``s^2`` per stack), the
encoder's final norm and its output (which every cross-attention's k/v projection reads), the
cross-attention's zero bias (``c heads s_dec s_enc``, kept by SDPA), decoder ids and labels,
the decoder's final norm, the head's input and the log-softmax of the logits in the compute
dtype (T5 does not upcast them before the loss).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.spec import ModelShape, ParamGroup, linear_groups

_F32 = 4
_I64 = 8


def t5_groups(model: ModelShape, *, decoder_block_only: bool = False) -> list[ParamGroup]:
    """Every parameter tensor of a ``t5`` model (or those of one decoder block)."""
    h, w, i = model.hidden_size, model.num_attention_heads * model.attention_head_dim, \
        model.intermediate_size
    enc, dec = (0, 1) if decoder_block_only else (model.num_layers, model.num_decoder_layers)
    n = enc + dec
    groups: list[ParamGroup] = []
    for name, count in (("", n), ("cross_", dec)):
        groups += linear_groups(f"{name}q", w, h, "col", False, count)
        groups += linear_groups(f"{name}k", w, h, "col", False, count)
        groups += linear_groups(f"{name}v", w, h, "col", False, count)
        groups += linear_groups(f"{name}o", h, w, "row", False, count)
    groups.append(ParamGroup("layer_norms", (h,), 2 * enc + 3 * dec))
    if model.ffn == "gated_gelu":
        groups += linear_groups("wi_0", i, h, "col", False, n)
        groups += linear_groups("wi_1", i, h, "col", False, n)
    else:
        groups += linear_groups("wi", i, h, "col", False, n)
    groups += linear_groups("wo", h, i, "row", False, n)
    if decoder_block_only:
        return groups
    groups.append(ParamGroup("relative_attention_bias",
                             (model.relative_attention_num_buckets, model.num_attention_heads), 2))
    # `shared` is tied into encoder.embed_tokens and decoder.embed_tokens: the root's.
    groups.append(ParamGroup("shared", (model.vocab_size, h), tp_dim=0, unit="root"))
    groups.append(ParamGroup("final_layer_norms", (h,), 2, unit="root"))
    if not model.tie_word_embeddings:
        groups.append(ParamGroup("lm_head", (model.vocab_size, h), tp_dim=0, unit="head"))
    return groups


def t5_block_params(model: ModelShape) -> tuple[int, int]:
    """Parameters of one encoder block and of one decoder block (cross-attention too)."""
    block = t5_groups(model, decoder_block_only=True)
    dec = sum(g.numel * g.count for g in block)
    cross = sum(g.numel * g.count for g in block if g.name.startswith("cross_"))
    return dec - cross - model.hidden_size, dec


def _norm(t: float, h: int, c: int) -> float:
    return _F32 * t * h + _F32 * t + c * t * h + (c * t * h if c != _F32 else 0)


def _mlp(model: ModelShape, t: float, c: int) -> dict[str, float]:
    i = model.intermediate_size
    terms = {"mlp": (7 if model.ffn == "gated_gelu" else 1) * c * t * i}
    if model.hidden_dropout > 0:
        terms["mlp"] += (1 + c) * t * i  # mask and the dropped activation wo saves
    return terms


def _self_attention(model: ModelShape, b: int, s: int, c: int, causal: bool) -> dict[str, float]:
    t, w, a = b * s, model.num_attention_heads * model.attention_head_dim, \
        model.num_attention_heads
    scores = b * a * s * s
    terms = {"attention_qkv": 3 * c * t * w, "attention_out": c * t * w,
             "attention_scores": c * scores + (s * s if causal else 0)}
    if model.attention_dropout > 0:
        terms["attention_scores"] += (1 + c) * scores
    return terms


def t5_layer_terms(model: ModelShape, b: int, s_enc: int, s_dec: int, c: int, *,
                   decoder: bool) -> dict[str, float]:
    """One encoder (or decoder) block's saved bytes, by tensor (module docstring)."""
    h = model.hidden_size
    s = s_dec if decoder else s_enc
    t = b * s
    norms = 3 if decoder else 2
    terms = {"norms": norms * _norm(t, h, c), "projection_inputs": norms * c * t * h}
    terms.update(_self_attention(model, b, s, c, causal=decoder))
    if decoder:
        w, a = model.num_attention_heads * model.attention_head_dim, model.num_attention_heads
        cross = _F32 * b * a * s_dec if model.attention == "sdpa" else c * b * a * s_dec * s_enc
        terms["cross_attention"] = 2 * c * t * w + cross
        terms["cross_attention_kv"] = 2 * c * b * s_enc * w
    terms.update(_mlp(model, t, c))
    if model.hidden_dropout > 0:
        terms["dropout_masks"] = norms * t * h
    return terms


def t5_model_terms(model: ModelShape, b: int, s_enc: int, s_dec: int, c: int) -> dict[str, float]:
    """Saved once per model (module docstring)."""
    h, a = model.hidden_size, model.num_attention_heads
    t_enc, t_dec = b * s_enc, b * s_dec
    terms = {
        "token_ids": _I64 * t_enc,
        "decoder_token_ids": _I64 * t_dec,
        "labels": _I64 * t_dec,
        "relative_position_buckets": _I64 * (s_enc * s_enc + s_dec * s_dec),
        "encoder_final_norm": _norm(t_enc, h, c),
        "encoder_output": c * t_enc * h,
        "cross_attention_bias": c * a * s_dec * s_enc if model.attention == "sdpa" else 0.0,
        "final_norm": _norm(t_dec, h, c),
        "head_input": c * t_dec * h,
        "log_softmax": c * t_dec * model.vocab_size,
        "loss": _F32,
    }
    if model.hidden_dropout > 0:
        terms["embedding_dropout_mask"] = 2 * (t_enc + t_dec) * h
    return terms


def from_t5_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields from a HF ``T5Config`` dict (t5, mt5, flan-t5 ``config.json``)."""
    proj = str(config.get("feed_forward_proj", "relu"))
    if proj not in ("relu", "gated-gelu"):
        raise ConfigError(f"feed_forward_proj={proj!r}: the planner knows 'relu' and "
                          "'gated-gelu' (T5, T5 v1.1, Flan-T5).")
    layers = int(config["num_layers"])
    dropout = float(config.get("dropout_rate", 0.1))
    return {
        "family": "t5", "hidden_size": int(config["d_model"]), "num_layers": layers,
        "num_decoder_layers": int(config.get("num_decoder_layers") or layers),
        "num_attention_heads": int(config["num_heads"]),
        "num_key_value_heads": int(config["num_heads"]), "head_dim": int(config["d_kv"]),
        "intermediate_size": int(config["d_ff"]), "vocab_size": int(config["vocab_size"]),
        "ffn": "gated_gelu" if proj == "gated-gelu" else "relu",
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", True)),
        "relative_attention_num_buckets": int(config.get("relative_attention_num_buckets", 32)),
        "hidden_dropout": dropout, "attention_dropout": dropout,
        "attention": "eager" if config.get("_attn_implementation") == "eager" else "sdpa",
    }


__all__ = ["from_t5_config", "t5_block_params", "t5_groups", "t5_layer_terms", "t5_model_terms"]
