"""Family ``bart``: parameters and saved activations of BART (meshtrain.plan.encdec dispatches).

Family ``bart`` is Hugging Face's ``BartForConditionalGeneration`` (bart-base, bart-large and
their fine-tunes): ``num_layers`` encoder blocks (self-attention, MLP) then
``num_decoder_layers`` decoder blocks (causal self-attention, cross-attention over the
encoder's output, MLP). Post-norm blocks (each sub-layer's residual sum goes through a
LayerNorm with bias), biases on every Linear, ``d_model`` attention width, a GELU (or ReLU)
MLP ``fc1``/``fc2``. Each stack has its own learned positional embedding
(``max_position_embeddings + 2`` rows: BART offsets positions by 2) and ``layernorm_embedding``;
the token embedding (``shared``, scaled by ``sqrt(d_model)`` when ``scale_embedding``) is tied
into both stacks and into the output head, so FSDP2 keeps it, the positional embeddings and the
embedding norms in the root group. ``final_logits_bias`` is a buffer, not a parameter.

Saved activations per block (what ``saved_tensors_hooks`` reports for HF's BART in torch 2.13
and transformers 5.24, measured to the byte in fp32: tests/sdk/test_plan_bart.py), with ``T``
the block's tokens (b s), ``h`` = d_model, ``i`` the MLP width, ``c`` compute-dtype bytes:

- each LayerNorm: its input (the residual sum, ``cTh``) and fp32 mean and rstd (``8T``);
- the projections' inputs (the block's input, the cross-attention's query input, the MLP's
  input: ``cTh`` each);
- SDPA attention: q, k, v and its output (``cTh`` each; the output is also ``out_proj``'s
  input) and the fp32 log-sum-exp (``4 b heads s``); no mask is saved (no padding mask in
  training, the decoder's causal one is SDPA's ``is_causal``). Eager attention keeps the
  softmax (``c b heads s_q s_k``) instead of the log-sum-exp;
- cross-attention's k and v over the encoder sequence (``2 c b s_enc h`` per decoder block);
- the MLP: GELU its input and output (``2 cTi``), ReLU its output (``cTi``).

Dropout, as CUDA runs it (``native_dropout``: a 1-byte mask per element): ``dropout`` after
each sub-layer (``Th`` per sub-layer) and after each ``layernorm_embedding``;
``activation_dropout`` on the MLP's activation (``Ti``, and ReLU's output is then saved beside
the dropped copy ``fc2`` reads); ``attention_dropout`` with eager attention a mask and the
dropped softmax per score. With SDPA the CUDA kernels (flash, memory-efficient) regenerate the
attention dropout mask from the RNG state: nothing per score. On CPU, dropout is not fused:
it saves a mask in the compute dtype, and SDPA with dropout falls back to the math path (the
test checks those layouts against this accounting with the CPU's mask size).
``encoder_layerdrop`` / ``decoder_layerdrop`` skip blocks at random: the plan keeps every block
(the worst case).

Once per model: token ids, position ids (int64: ``b s_enc`` for the encoder, ``s_dec`` for the
decoder), each stack's ``layernorm_embedding``, the encoder's output (which every
cross-attention's k/v projection reads), decoder ids and labels, the head's input and the fp32
log-softmax of the logits: ``final_logits_bias`` is an fp32 buffer (FSDP2's mixed precision
casts parameters, not buffers), so adding it promotes 16-bit logits to fp32 before the loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.spec import ModelShape, ParamGroup, linear_groups

_F32 = 4
_I64 = 8
_POSITION_OFFSET = 2
"""BART's learned positional embeddings have two rows more than max_position_embeddings."""
_MLPS = {"gelu": "gelu", "relu": "relu"}
"""HF ``activation_function`` -> ModelSpec ``ffn`` (the ones measured)."""


def _attention(prefix: str, h: int, count: int) -> list[ParamGroup]:
    groups = linear_groups(f"{prefix}q_proj", h, h, "col", True, count)
    groups += linear_groups(f"{prefix}k_proj", h, h, "col", True, count)
    groups += linear_groups(f"{prefix}v_proj", h, h, "col", True, count)
    return groups + linear_groups(f"{prefix}out_proj", h, h, "row", True, count)


def bart_groups(model: ModelShape, *, decoder_block_only: bool = False) -> list[ParamGroup]:
    """Every parameter tensor of a ``bart`` model (or those of one decoder block)."""
    h, i = model.hidden_size, model.intermediate_size
    enc, dec = (0, 1) if decoder_block_only else (model.num_layers, model.num_decoder_layers)
    n = enc + dec
    groups = _attention("", h, n) + _attention("encoder_attn.", h, dec)
    groups += linear_groups("fc1", i, h, "col", True, n)
    groups += linear_groups("fc2", h, i, "row", True, n)
    groups.append(ParamGroup("layer_norms", (h,), 2 * (2 * enc + 3 * dec)))  # weight and bias
    if decoder_block_only:
        return groups
    positions = model.max_position_embeddings + _POSITION_OFFSET
    # `shared` is tied into both stacks (and the head): the root's, with what is outside blocks.
    groups.append(ParamGroup("shared", (model.vocab_size, h), tp_dim=0, unit="root"))
    groups.append(ParamGroup("embed_positions", (positions, h), 2, unit="root"))
    groups.append(ParamGroup("layernorm_embedding", (h,), 4, unit="root"))
    return groups


def bart_block_params(model: ModelShape) -> tuple[int, int]:
    """Parameters of one encoder block and of one decoder block (cross-attention too)."""
    block = bart_groups(model, decoder_block_only=True)
    dec = sum(g.numel * g.count for g in block)
    cross = sum(g.numel * g.count for g in block if g.name.startswith("encoder_attn."))
    return dec - cross - 2 * model.hidden_size, dec


def _layer_norm(t: float, h: int, c: int) -> float:
    return c * t * h + 2 * _F32 * t


def _attention_terms(model: ModelShape, b: int, s_q: int, s_k: int, c: int,
                     prefix: str) -> dict[str, float]:
    """q and output over `s_q` queries, k and v over `s_k` keys, and the kernel's own."""
    h, a = model.hidden_size, model.num_attention_heads
    scores = b * a * s_q * s_k
    if model.attention == "sdpa":
        kernel = _F32 * b * a * s_q
    else:
        kernel = c * scores + (c * scores if model.attention_dropout > 0 else 0)
    return {f"{prefix}q_out": 2 * c * b * s_q * h, f"{prefix}kv": 2 * c * b * s_k * h,
            f"{prefix}kernel": kernel}


def _masks(model: ModelShape, b: int, s: int, s_enc: int, decoder: bool) -> float:
    """1-byte dropout masks of one block (CUDA's fused dropout)."""
    t, h, a = b * s, model.hidden_size, model.num_attention_heads
    sublayers = 3 if decoder else 2
    masks = sublayers * t * h if model.hidden_dropout > 0 else 0
    masks += t * model.intermediate_size if model.activation_dropout > 0 else 0
    if model.attention == "eager" and model.attention_dropout > 0:
        masks += b * a * s * s + (b * a * s * s_enc if decoder else 0)
    return masks


def bart_layer_terms(model: ModelShape, b: int, s_enc: int, s_dec: int, c: int, *,
                     decoder: bool) -> dict[str, float]:
    """One encoder (or decoder) block's saved bytes, by tensor (module docstring)."""
    h, i = model.hidden_size, model.intermediate_size
    s = s_dec if decoder else s_enc
    t = b * s
    norms = 3 if decoder else 2
    terms = {"norms": norms * _layer_norm(t, h, c), "projection_inputs": norms * c * t * h}
    terms.update(_attention_terms(model, b, s, s, c, "attention_"))
    if decoder:
        terms.update(_attention_terms(model, b, s_dec, s_enc, c, "cross_attention_"))
    relu_kept = model.ffn == "relu" and model.activation_dropout > 0
    terms["mlp"] = (1 if model.ffn == "relu" and not relu_kept else 2) * c * t * i
    masks = _masks(model, b, s, s_enc, decoder)
    if masks:
        terms["dropout_masks"] = masks
    return terms


def bart_model_terms(model: ModelShape, b: int, s_enc: int, s_dec: int,
                     c: int) -> dict[str, float]:
    """Saved once per model (module docstring)."""
    h = model.hidden_size
    t_enc, t_dec = b * s_enc, b * s_dec
    terms = {
        "token_ids": _I64 * t_enc,
        "position_ids": _I64 * (t_enc + s_dec),
        "embedding_norms": _layer_norm(t_enc, h, c) + _layer_norm(t_dec, h, c),
        "decoder_token_ids": _I64 * t_dec,
        "labels": _I64 * t_dec,
        "encoder_output": c * t_enc * h,
        "head_input": c * t_dec * h,
        "logits_fp32": _F32 * t_dec * model.vocab_size,
        "loss": _F32,
    }
    if model.hidden_dropout > 0:
        terms["embedding_dropout_mask"] = (t_enc + t_dec) * h
    return terms


def _same(config: Mapping[str, Any], encoder_key: str, decoder_key: str) -> int:
    value = int(config[encoder_key])
    if int(config.get(decoder_key, value)) != value:
        raise ConfigError(f"{encoder_key}={value} and {decoder_key}={config[decoder_key]} "
                          "differ: the planner sizes BART with one value for both stacks.")
    return value


def from_bart_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec fields from a HF ``BartConfig`` dict (bart ``config.json``)."""
    activation = str(config.get("activation_function", "gelu"))
    if activation not in _MLPS:
        raise ConfigError(f"activation_function={activation!r}: the planner knows "
                          f"{' and '.join(map(repr, _MLPS))} for BART.")
    if not config.get("tie_word_embeddings", True):
        raise ConfigError("tie_word_embeddings=false: the planner sizes BART with its embedding "
                          "tied into both stacks and the head, as its configs have it "
                          "(transformers 5 unties all three then, 4.x only the head).")
    heads = _same(config, "encoder_attention_heads", "decoder_attention_heads")
    return {
        "family": "bart", "hidden_size": int(config["d_model"]),
        "num_layers": int(config["encoder_layers"]),
        "num_decoder_layers": int(config["decoder_layers"]),
        "num_attention_heads": heads, "num_key_value_heads": heads,
        "intermediate_size": _same(config, "encoder_ffn_dim", "decoder_ffn_dim"),
        "vocab_size": int(config["vocab_size"]), "ffn": _MLPS[activation],
        "max_position_embeddings": int(config.get("max_position_embeddings", 1024)),
        "tie_word_embeddings": True,
        "qkv_bias": True, "o_bias": True, "mlp_bias": True,
        "hidden_dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "activation_dropout": float(config.get("activation_dropout", 0.0)),
        "attention": "eager" if config.get("_attn_implementation") == "eager" else "sdpa",
    }


__all__ = ["bart_block_params", "bart_groups", "bart_layer_terms", "bart_model_terms",
           "from_bart_config"]
