"""Model shapes the planner understands: presets, Hugging Face `config.json`, dimensions.

A `ModelSpec` is what the memory, activation and communication formulas read. Families:

- ``llama``: Llama / Mistral / Qwen2 layers (RMSNorm, SwiGLU MLP, rotary, grouped-query
  attention, no dropout); ``mixtral`` is the same with a top-k mixture-of-experts MLP.
- ``gpt_neox``: LayerNorm with bias, GELU MLP, fused QKV with bias, partial rotary, parallel
  residual.
- ``gpt``: the GPT layer of Korthikanti et al. 2022 (LayerNorm, 4h GELU MLP, dropout, no
  fused attention kernel), kept as the reference the paper's formulas are stated for.
- ``t5``: encoder-decoder (T5, T5 v1.1, Flan-T5; meshtrain.plan.t5): ``num_layers``
  encoder blocks and ``num_decoder_layers`` decoder blocks with cross-attention.
- ``bart``: encoder-decoder (BART; meshtrain.plan.bart): post-norm LayerNorm blocks, GELU
  MLP, learned positions, the shared embedding tied into both stacks and the head.

The shape itself (`ModelShape`, `ParamGroup`) is meshtrain.plan.spec's; the encoder-decoder
families are dispatched by meshtrain.plan.encdec.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain.plan.encdec import CONFIG_MODEL_TYPES, encdec_groups, from_encdec_config
from meshtrain.plan.spec import ModelShape, ParamGroup, linear_groups


class ModelSpec(ModelShape):
    """A transformer's shape (meshtrain.plan.spec.ModelShape) and its parameter count."""

    @property
    def num_params(self) -> int:
        """Total parameters (the declared count when the shape is synthesized)."""
        if self.declared_num_params is not None:
            return self.declared_num_params
        return sum(group.numel * group.count for group in param_groups(self))


def param_groups(model: ModelSpec) -> list[ParamGroup]:
    """Every parameter tensor of `model`, grouped by shape, with its TP/EP placement.

    TP placement follows the model's Hugging Face tensor-parallel plan (``base_model_tp_plan``):
    projections into heads / the MLP are column-wise (dim 0), projections out row-wise (dim 1);
    norms are replicated; the output head is column-wise and the input embedding is split over
    the vocabulary (dim 0), as meshtrain's runtime adds them to the HF plan (vocab-parallel
    embedding, Megatron's ``VocabParallelEmbedding``). With only a parameter count the whole
    model is one TP-splittable group (norms are < 0.1 %).
    """
    if model.declared_num_params is not None:
        return [ParamGroup("params", (model.declared_num_params,), tp_dim=0)]
    if model.is_encoder_decoder:
        return encdec_groups(model)
    builders = {"llama": _llama_groups, "mixtral": _llama_groups,
                "gpt_neox": _neox_groups, "gpt": _gpt_groups}
    return builders[model.family](model)


def _embeddings(model: ModelSpec, norm_params: int) -> list[ParamGroup]:
    h, v = model.hidden_size, model.vocab_size
    groups = [ParamGroup("embed_tokens", (v, h), tp_dim=0, unit="embedding")]
    groups += [ParamGroup("final_norm", (h,), norm_params, unit="root")]
    if not model.tie_word_embeddings:
        groups.append(ParamGroup("lm_head", (v, h), tp_dim=0, unit="head"))
    return groups


def _llama_groups(model: ModelSpec) -> list[ParamGroup]:
    h, n, d = model.hidden_size, model.num_layers, model.attention_head_dim
    q, kv, i = model.num_attention_heads * d, model.num_key_value_heads * d, model.intermediate_size
    groups = linear_groups("q_proj", q, h, "col", model.qkv_bias, n)
    groups += linear_groups("k_proj", kv, h, "col", model.qkv_bias, n)
    groups += linear_groups("v_proj", kv, h, "col", model.qkv_bias, n)
    groups += linear_groups("o_proj", h, q, "row", model.o_bias, n)
    groups.append(ParamGroup("norms", (h,), 2 * n))
    if model.is_moe:
        e = model.num_experts
        groups.append(ParamGroup("router", (e, h), n))
        groups.append(ParamGroup("experts.gate_up_proj", (e, 2 * i, h), n, 1, expert=True))
        groups.append(ParamGroup("experts.down_proj", (e, h, i), n, 2, expert=True))
    else:
        groups += linear_groups("gate_proj", i, h, "col", model.mlp_bias, n)
        groups += linear_groups("up_proj", i, h, "col", model.mlp_bias, n)
        groups += linear_groups("down_proj", h, i, "row", model.mlp_bias, n)
    return groups + _embeddings(model, 1)


def _neox_groups(model: ModelSpec) -> list[ParamGroup]:
    h, n, i = model.hidden_size, model.num_layers, model.intermediate_size
    groups = linear_groups("query_key_value", 3 * h, h, "col", True, n)
    groups += linear_groups("dense", h, h, "row", True, n)
    groups += linear_groups("dense_h_to_4h", i, h, "col", True, n)
    groups += linear_groups("dense_4h_to_h", h, i, "row", True, n)
    groups.append(ParamGroup("layernorms", (h,), 4 * n))
    return groups + _embeddings(model, 2)


def _gpt_groups(model: ModelSpec) -> list[ParamGroup]:
    h, n, i = model.hidden_size, model.num_layers, model.intermediate_size
    groups = linear_groups("qkv", 3 * h, h, "col", True, n)
    groups += linear_groups("proj", h, h, "row", True, n)
    groups += linear_groups("fc1", i, h, "col", True, n)
    groups += linear_groups("fc2", h, i, "row", True, n)
    groups.append(ParamGroup("layernorms", (h,), 4 * n))
    groups.append(ParamGroup("position_embeddings", (model.max_position_embeddings, h),
                             unit="embedding"))
    # Megatron's GPT: vocabulary-parallel input embedding, tied with the output layer.
    groups.append(ParamGroup("embed_tokens", (model.vocab_size, h), tp_dim=0, unit="embedding"))
    groups.append(ParamGroup("final_norm", (h,), 2, unit="root"))
    return groups


def _llama(name: str, h: int, n: int, a: int, kv: int, i: int, v: int, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, hidden_size=h, num_layers=n, num_attention_heads=a,
                     num_key_value_heads=kv, intermediate_size=i, vocab_size=v, source="preset",
                     **kw)


def _bart(name: str, h: int, n: int, a: int, i: int) -> ModelSpec:
    """facebook/bart-* (their config.json): n encoder and n decoder blocks, vocabulary 50265,
    1024 positions, GELU MLP, biases, head tied to `shared`, every dropout 0.1."""
    return _llama(name, h, n, a, a, i, 50265, family="bart", num_decoder_layers=n, ffn="gelu",
                  max_position_embeddings=1024, tie_word_embeddings=True, qkv_bias=True,
                  o_bias=True, mlp_bias=True, hidden_dropout=0.1, attention_dropout=0.1,
                  activation_dropout=0.1)


# Shapes from each model's published Hugging Face config.json.
PRESETS: dict[str, ModelSpec] = {
    "llama2-7b": _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000),
    "llama2-13b": _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000),
    "llama2-70b": _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000),
    "llama3-8b": _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
    "llama3-70b": _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
    "mistral-7b": _llama("mistral-7b", 4096, 32, 32, 8, 14336, 32000),
    "mixtral-8x7b": _llama("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, family="mixtral",
                           num_experts=8, experts_per_token=2),
    "gpt-neox-20b": _llama("gpt-neox-20b", 6144, 44, 64, 64, 24576, 50432, family="gpt_neox",
                           rotary_fraction=0.25, max_position_embeddings=2048),
    # T5 (d_model, num_layers, num_heads, d_kv, d_ff, vocab_size): tied head, relu MLP; Flan-T5
    # (T5 v1.1): untied head, gated-gelu MLP. Dropout 0.1 as their configs say.
    "t5-3b": _llama("t5-3b", 1024, 24, 32, 32, 16384, 32128, family="t5", num_decoder_layers=24,
                    head_dim=128, ffn="relu", tie_word_embeddings=True, hidden_dropout=0.1,
                    attention_dropout=0.1),
    "t5-11b": _llama("t5-11b", 1024, 24, 128, 128, 65536, 32128, family="t5",
                     num_decoder_layers=24, head_dim=128, ffn="relu", tie_word_embeddings=True,
                     hidden_dropout=0.1, attention_dropout=0.1),
    "flan-t5-xl": _llama("flan-t5-xl", 2048, 24, 32, 32, 5120, 32128, family="t5",
                         num_decoder_layers=24, head_dim=64, ffn="gated_gelu",
                         hidden_dropout=0.1, attention_dropout=0.1),
    # BART (d_model, encoder_layers = decoder_layers, attention heads, ffn_dim):
    # facebook/bart-base and facebook/bart-large config.json.
    "bart-base": _bart("bart-base", 768, 6, 12, 3072),
    "bart-large": _bart("bart-large", 1024, 12, 16, 4096),
}


def llama_shaped(num_params: float, *, vocab_size: int = 32000) -> ModelSpec:
    """A Llama-shaped model of about `num_params` parameters (for `--num-params` alone).

    Llama 2's aspect ratio: head dim 128 and about one layer per 128 of hidden size;
    12 h^2 parameters per layer (4 h^2 attention, 3 h x 8h/3 SwiGLU) plus 2 V h embeddings.
    The planner keeps the given count for model states; the shape only sizes activations.
    """
    n = int(num_params)
    if n < 1_000_000:
        raise ConfigError(f"--num-params {num_params:g} is too small to plan (< 1e6).")
    low, high = 1.0, 1e6  # solve 12 h^3 / 128 + 2 V h = n for h by bisection
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if 12 * mid**3 / 128 + 2 * vocab_size * mid < n else (low, mid)
    hidden = max(128, round(low / 128) * 128)
    layers = max(1, round((n - 2 * vocab_size * hidden) / (12 * hidden**2)))
    intermediate = max(256, round(8 * hidden / 3 / 256) * 256)
    heads = hidden // 128
    return ModelSpec(name=f"{n / 1e9:.3g}B parameters (Llama-shaped)", hidden_size=hidden,
                     num_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                     intermediate_size=intermediate, vocab_size=vocab_size,
                     declared_num_params=n, source="num_params")


def from_hf_config(config: Mapping[str, Any], *, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config dict (what `config.json` holds)."""
    model_type = str(config.get("model_type", ""))
    try:
        fields = _hf_fields(config, model_type)
        return ModelSpec(name=name or config.get("_name_or_path") or model_type or "hf-model",
                         source="config.json", **fields)
    except KeyError as error:
        raise ConfigError(
            f"config.json of model_type {model_type!r} lacks {error.args[0]!r}; the planner "
            "needs hidden_size, num_hidden_layers, num_attention_heads, intermediate_size and "
            "vocab_size."
        ) from None
    except ValidationError as error:
        raise ConfigError(f"config.json does not describe a model the planner can size: "
                          f"{error.errors()[0]['msg']}") from None


def _hf_fields(config: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    if model_type in CONFIG_MODEL_TYPES:
        return from_encdec_config(config, model_type)
    heads = int(config["num_attention_heads"])
    fields: dict[str, Any] = {
        "hidden_size": int(config["hidden_size"]),
        "num_layers": int(config["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
        "intermediate_size": int(config["intermediate_size"]),
        "vocab_size": int(config["vocab_size"]),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "max_position_embeddings": int(config.get("max_position_embeddings", 4096)),
        "head_dim": config.get("head_dim"),
        "attention": "eager" if config.get("_attn_implementation") == "eager" else "sdpa",
        "rotary_fraction": _rotary_fraction(config),
    }
    if model_type in ("llama", "mistral", "mixtral", "qwen2"):
        bias = bool(config.get("attention_bias", False))
        fields.update(qkv_bias=bias or model_type == "qwen2", o_bias=bias,
                      mlp_bias=bool(config.get("mlp_bias", False)),
                      attention_dropout=float(config.get("attention_dropout", 0.0)))
        if model_type == "mixtral":
            fields.update(family="mixtral", num_experts=int(config["num_local_experts"]),
                          experts_per_token=int(config["num_experts_per_tok"]))
        return fields
    if model_type == "gpt_neox":
        fields.update(family="gpt_neox",
                      attention_dropout=float(config.get("attention_dropout", 0.0)),
                      hidden_dropout=float(config.get("hidden_dropout", 0.0)),
                      tie_word_embeddings=False)
        return fields
    raise ConfigError(
        f"model_type {model_type!r} is not one the planner knows (llama, mistral, qwen2, "
        "mixtral, gpt_neox, t5, mt5, bart). Give its dimensions instead (--hidden-size, "
        "--num-layers, ...)."
    )


def _rotary_fraction(config: Mapping[str, Any]) -> float:
    """transformers 4.x: rotary_pct / partial_rotary_factor; 5.x: inside rope_parameters."""
    rope = config.get("rope_parameters") or {}
    for value in (config.get("rotary_pct"), config.get("partial_rotary_factor"),
                  rope.get("partial_rotary_factor") if isinstance(rope, Mapping) else None):
        if value is not None:
            return float(value)
    return 1.0


def load_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a `config.json` file, or a directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{str(path)!r} does not exist: give a preset name "
                          f"({', '.join(PRESETS)}) or a config.json path.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"Cannot parse {str(path)!r} as JSON: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{str(path)!r} must hold a JSON object (a Hugging Face config).")
    return from_hf_config(config, name=path.parent.name or path.name)


def resolve_model(model: str | Path | Mapping[str, Any] | ModelSpec) -> ModelSpec:
    """A preset name, a config.json path, a HF config dict or a ModelSpec -> ModelSpec."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return from_hf_config(model)
    key = str(model).lower()
    if key in PRESETS:
        return PRESETS[key]
    if Path(model).exists():
        return load_hf_config(model)
    raise ConfigError(
        f"Unknown model {str(model)!r}.{did_you_mean(key, PRESETS)} Presets: "
        f"{', '.join(PRESETS)}; or give a config.json path, dimensions, or --num-params."
    )


__all__ = [
    "PRESETS",
    "ModelSpec",
    "ParamGroup",
    "from_hf_config",
    "llama_shaped",
    "load_hf_config",
    "param_groups",
    "resolve_model",
]
