"""The shape of a model and its parameter tensors: what every family module reads.

`ModelShape` holds the dimensions (validated); `ParamGroup` one kind of parameter tensor with
its tensor-parallel placement. The family modules (meshtrain.plan.t5, meshtrain.plan.bart) and
the dispatch over families (meshtrain.plan.encdec, meshtrain.plan.models) import this module;
it imports none of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator

Family = Literal["llama", "mixtral", "gpt_neox", "gpt", "t5", "bart"]
ENCODER_DECODER_FAMILIES = ("t5", "bart")


class ModelShape(BaseModel):
    """A transformer's shape, as the planner needs it (decoder-only, or encoder-decoder with
    ``num_decoder_layers``; then ``num_layers`` counts the encoder's blocks).

    What the family modules read; `meshtrain.plan.models.ModelSpec` adds the parameter count
    (which needs every family's parameter list).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    family: Family = "llama"
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    rotary_fraction: float = 1.0
    max_position_embeddings: int = 4096
    attention: Literal["sdpa", "eager"] = "sdpa"
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    activation_dropout: float = 0.0
    """Family ``bart``: dropout on the MLP's activation (T5 uses ``hidden_dropout`` there)."""
    num_decoder_layers: int = 0
    """Encoder-decoder (families ``t5``, ``bart``): the decoder's blocks; 0 for decoder-only
    models."""
    ffn: Literal["swiglu", "relu", "gated_gelu", "gelu"] = "swiglu"
    """The MLP of an encoder-decoder: ``relu`` (T5 v1.0) or ``gated_gelu`` (T5 v1.1,
    Flan-T5); ``gelu`` (BART) or ``relu``."""
    relative_attention_num_buckets: int = 32
    largest_layer_params: int | None = None
    """Parameters of the largest block, when blocks differ or only a count is known: it sizes
    the unsharded buffers FSDP gathers per block (default: the shape's block)."""
    declared_num_params: int | None = None
    """Set when only the parameter count is known: the shape above is synthesized."""
    source: str = "dimensions"

    @model_validator(mode="after")
    def _check_shape(self) -> ModelShape:
        for key in ("hidden_size", "num_layers", "num_attention_heads", "num_key_value_heads",
                    "intermediate_size", "vocab_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be at least 1")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of num_attention_heads="
                f"{self.num_attention_heads}; give head_dim explicitly"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        self._check_encoder_decoder()
        if (self.family == "mixtral") != (self.num_experts > 0):
            raise ValueError("family 'mixtral' needs num_experts > 0, and only it has experts")
        if self.num_experts and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} must be in 1..{self.num_experts}"
            )
        return self

    def _check_encoder_decoder(self) -> None:
        """Families ``t5`` and ``bart``: decoder layers, their MLPs, BART's fixed choices."""
        if (self.family in ENCODER_DECODER_FAMILIES) != (self.num_decoder_layers > 0):
            raise ValueError("families 't5' and 'bart' (encoder-decoder) need "
                             "num_decoder_layers > 0, and only they have decoder layers")
        mlps = {"t5": ("relu", "gated_gelu"), "bart": ("gelu", "relu")}.get(self.family)
        if mlps and self.ffn not in mlps:
            raise ValueError(f"family {self.family!r} has a {' or '.join(map(repr, mlps))} MLP "
                             f"(ffn), not {self.ffn!r}")
        if self.family == "bart" and (self.num_key_value_heads != self.num_attention_heads
                                      or self.attention_head_dim * self.num_attention_heads
                                      != self.hidden_size):
            raise ValueError("family 'bart' has hidden_size / num_attention_heads per head and "
                             "as many key/value heads as heads (no head_dim of its own)")
        if self.family == "bart" and not self.tie_word_embeddings:
            raise ValueError("family 'bart' ties its embedding into both stacks and the head "
                             "(tie_word_embeddings)")

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.attention_head_dim * self.rotary_fraction)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_encoder_decoder(self) -> bool:
        return self.num_decoder_layers > 0

    @property
    def num_blocks(self) -> int:
        """Blocks FSDP wraps one by one: encoder and decoder blocks together."""
        return self.num_layers + self.num_decoder_layers


@dataclass(frozen=True)
class ParamGroup:
    """`count` parameter tensors of one `shape`.

    `tp_dim` is the dim tensor parallelism splits (None: replicated over the TP group);
    `expert` tensors have the experts in dim 0, which expert parallelism splits.
    `unit` names the FSDP unit ("layer", "embedding", "head", "root").
    """

    name: str
    shape: tuple[int, ...]
    count: int = 1
    tp_dim: int | None = None
    expert: bool = False
    unit: str = "layer"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def linear_groups(name: str, out: int, inp: int, tp: str | None, bias: bool,
                  n: int) -> list[ParamGroup]:
    """A Linear's weight (out, in) and bias: colwise splits dim 0 and the bias, rowwise dim 1."""
    weight = ParamGroup(name, (out, inp), n, {"col": 0, "row": 1, None: None}[tp])
    if not bias:
        return [weight]
    return [weight, ParamGroup(f"{name}.bias", (out,), n, 0 if tp == "col" else None)]


__all__ = ["ENCODER_DECODER_FAMILIES", "Family", "ModelShape", "ParamGroup", "linear_groups"]
