"""Activation memory: the tensors autograd keeps from forward to backward, per GPU.

The per-layer accounting follows Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", section 4): list what each operation saves for backward, divide
what tensor / sequence parallelism splits, and drop what recomputation does not keep. For the
paper's GPT layer (family ``gpt``) the sum is exactly the paper's
``sbh (34 + 5as/h)`` bytes (16-bit, no parallelism), ``sbh (10 + 24/t + 5as/(ht))`` with tensor
parallelism, ``sbh/t (34 + 5as/h)`` with sequence parallelism too, ``34 sbh / t`` with selective
recomputation and ``2 sbh`` with full recomputation.

Hugging Face layers save different tensors, listed per family below (what
``torch.autograd.graph.saved_tensors_hooks`` reports, counting each storage once and leaving
parameters out):

- RMSNorm (Llama) is not fused: it saves its input as fp32 (the input itself in fp32 training,
  a copy in bf16), ``rsqrt`` of the variance (fp32, one number per token) and the normalised
  input in the compute dtype (for the weight's gradient); the norm's output is saved by the
  projections that read it.
- SDPA attention (flash-style, the default) saves q, k, v (k and v with the key/value heads
  of grouped-query attention), the output and the fp32 log-sum-exp per head and token; no
  ``s x s`` tensor. Llama's output is laid out (b, s, heads, d) so ``o_proj`` saves the same
  storage; GPT-NeoX's is copied first.
- Eager attention repeats k and v to all heads and keeps the fp32 softmax (plus a cast copy in
  16-bit training) and a contiguous copy of its output.
- SwiGLU saves the gate output, its SiLU, the up output and their product (4 x intermediate);
  GELU saves its input and output (2 x intermediate).
- Mixtral's sparse block saves fp32 router probabilities, top-k indices and weights, and per
  routed token the gathered input, the expert MLP tensors and the expert output.
- Dropout with p > 0 saves a 1-byte mask (HF configs default to p = 0: nothing).

Tensor parallelism (HF plans: q/k/v/gate/up column-wise, o/down row-wise) splits heads and the
intermediate dim. With sequence parallelism norms run on a sequence shard, but torch saves the
all-gathered input of each column-wise projection, so those stay full size (Megatron saves the
shard and gathers again in backward; the ``gpt`` family keeps the paper's convention).

Op-level selective checkpointing (``recompute="op"``: the runtime's
``activation_checkpointing: "selective"``, meshtrain_runtime.parallel.selective) keeps, per
checkpointed layer, its input and the outputs of its matmuls and fused attention
(`kept_terms`): q, k and v, the attention's output and log-sum-exp (SDPA only: an eager
attention's score matmuls are recomputed), the output projections' outputs (with sequence
parallelism also their reduce-scatter outputs), and the MLP's up-projections (SwiGLU: gate and
up; GELU: its input); Mixtral's router logits and each routed token's expert matmuls.
Recomputed in backward: everything else of the layer (norms, rotary embeddings, activations,
products), which exists again while the layer's backward runs; the kept outputs become part
of it, except those only a later op read (q and k before the rotary embedding, the output
projections' outputs), which are freed as the recompute uses them. torch's checkpoint stops
the recompute once backward has what it needs, so the MLP's output projection is not rerun
and its kept output stays until the layer's backward ends.

Context parallelism splits the sequence: every term counts the rank's ``s / cp`` tokens. Its
attention (meshtrain_runtime.parallel.context) replaces the model's own, eager or SDPA: it saves
the local q, k and v (k and v with the key/value heads, never repeated), its output (heads
first) and the fp32 log-sum-exp per head and token, as SDPA does; no ``s x s`` scores, since the
blocks are recomputed in backward. Its output is then copied to (b, s, heads, d) for the output
projection, which saves that copy: the output counts twice. With ``a2a`` the saved q, k, v and
output are the all-to-all's (heads / cp over the whole sequence: the same bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.encdec import check_layout, checkpointed_blocks, layer_terms, model_terms
from meshtrain.plan.models import ModelSpec

Recompute = Literal["none", "selective", "full", "op"]
RECOMPUTE_FOR_POLICY: dict[str, Recompute] = {"none": "none", "full": "full", "selective": "op"}
"""The planner's `recompute` for each `activation_checkpointing` policy of the runtime (its
"selective" is op-level, this module's "op"; the planner's "selective" is the paper's)."""
ACT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_F32 = 4
_I64 = 8


@dataclass(frozen=True)
class _Shape:
    """Per-rank sizes: tokens t, sequence s, heads a / kv, head dim d, ... and dividers."""

    b: int
    s: int
    h: int
    a: float
    kv: float
    d: int
    i: float
    v: int
    act: int
    sp_div: int
    tp: int
    cp: int = 1

    @property
    def t(self) -> int:
        return self.b * self.s


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes one GPU keeps at the end of the forward pass, and their parts."""

    layer_terms: dict[str, float]
    """One layer without recomputation (or with selective recomputation), by tensor."""
    checkpoint_bytes: float
    """The input of one checkpointed layer (what offloading moves to host memory)."""
    num_layers: int
    num_checkpointed: int
    num_checkpoints_on_gpu: int
    """Checkpointed layers whose inputs stay on the GPU (all, or the offload horizon)."""
    model_terms: dict[str, float] = field(default_factory=dict)
    """Once per model: token ids, rotary tables, final norm, head input, logits, labels."""
    encoder_layer_terms: dict[str, float] = field(default_factory=dict)
    """Encoder-decoder models: one encoder block (`layer_terms` is then a decoder block's, the
    last block in forward and the first in backward; `num_layers` counts the decoder's)."""
    num_encoder_layers: int = 0
    encoder_checkpointed: int = 0
    encoder_checkpoints_on_gpu: int = 0
    encoder_checkpoint_bytes: float = 0.0
    kept_terms: dict[str, float] = field(default_factory=dict)
    """Op-level selective checkpointing: the op outputs one checkpointed layer keeps besides
    its input (they stay on the GPU when the input is offloaded)."""
    offload: bool = False
    """The checkpointed layers' inputs go to host memory during forward (all of them until
    the forward ends; `num_checkpoints_on_gpu` of them are back after it)."""
    mlp_backward_bytes: float = 0.0
    """One layer's MLP backward at its high-water mark, above the layer's saved tensors: the
    activation gradients alive at once (SwiGLU: the gate activation's and up's, while the
    product's is being consumed; GELU: its input's and output's)."""

    @property
    def layer_bytes(self) -> float:
        return sum(self.layer_terms.values())

    @property
    def kept_bytes(self) -> float:
        return sum(self.kept_terms.values())

    @property
    def encoder_layer_bytes(self) -> float:
        return sum(self.encoder_layer_terms.values())

    @property
    def total_bytes(self) -> float:
        full = (self.num_layers - self.num_checkpointed) * self.layer_bytes
        checkpoints = (self.num_checkpoints_on_gpu * self.checkpoint_bytes
                       + self.num_checkpointed * self.kept_bytes)
        encoder = ((self.num_encoder_layers - self.encoder_checkpointed) * self.encoder_layer_bytes
                   + self.encoder_checkpoints_on_gpu * self.encoder_checkpoint_bytes)
        return full + checkpoints + encoder + sum(self.model_terms.values())

    @property
    def forward_bytes(self) -> float:
        """`total_bytes` while the forward runs: offloaded inputs are all on the host until
        the root forward ends (then the loading horizon's come back)."""
        if not self.offload:
            return self.total_bytes
        return self.total_bytes - self.num_checkpoints_on_gpu * self.checkpoint_bytes

    @property
    def recompute_working_bytes(self) -> float:
        """During backward a recomputed layer's full activations exist again (one at a time);
        a selective layer's kept outputs are part of them, or were freed by the recompute,
        except the MLP output projection's (the recompute stops before it)."""
        if not self.num_checkpointed:
            return 0.0
        return self.layer_bytes - self.kept_bytes + self.kept_terms.get("kept_mlp_output", 0.0)

    @property
    def running_bytes(self) -> float:
        """A checkpointed layer's forward at its high-water mark above what it keeps: its MLP's
        intermediates while the output projection runs (those not kept)."""
        if not self.num_checkpointed:
            return 0.0
        mlp = self.layer_terms.get("mlp", self.layer_terms.get(
            "moe_experts", self.layer_terms.get("gelu_input_output", 0.0)))
        return mlp - self.kept_terms.get("kept_mlp", 0.0)


def activation_bytes(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch: int,
    precision: str = "bf16",
    tensor_parallel_degree: int = 1,
    sequence_parallel: bool = False,
    context_parallel_degree: int = 1,
    recompute: Recompute = "none",
    checkpoint_interval: int = 1,
    offload: bool = False,
    loading_horizon: int = 2,
    loss_parallel: bool = False,
    decoder_seq_len: int | None = None,
) -> ActivationEstimate:
    """Activation bytes per GPU for `micro_batch` sequences of `seq_len` tokens.

    `recompute="full"` checkpoints blocks 0, n, 2n, ... (n = `checkpoint_interval`) and keeps
    only their inputs; `offload` moves those inputs to host memory except `loading_horizon`
    layers'. `"op"` checkpoints the same blocks op by op: they keep their matmul and fused
    attention outputs too (the runtime's ``activation_checkpointing: "selective"``; see
    `RECOMPUTE_FOR_POLICY`). `"selective"` is the paper's: every layer recomputes its attention
    core only (drops the s x s tensors).
    `loss_parallel` keeps the logits split over the vocabulary (the runtime's option; by
    default the head gathers them, as HF's ``colwise_gather_output`` does).
    Encoder-decoder models (families ``t5``, ``bart``): `seq_len` is the encoder's,
    `decoder_seq_len` the decoder's (default `seq_len`); see meshtrain.plan.encdec.
    """
    if precision not in ACT_BYTES:
        raise ConfigError(f"precision={precision!r}: use one of {', '.join(ACT_BYTES)}.")
    if model.is_encoder_decoder:
        check_layout(model, tensor_parallel_degree=tensor_parallel_degree,
                     context_parallel_degree=context_parallel_degree)
        _check_decoder_only(model, recompute)
        return _encoder_decoder(model, seq_len, decoder_seq_len or seq_len, micro_batch,
                                ACT_BYTES[precision], recompute == "full" and checkpoint_interval,
                                offload, loading_horizon)
    if seq_len % context_parallel_degree:
        raise ConfigError(f"seq_len={seq_len} is not divisible by context_parallel_degree="
                          f"{context_parallel_degree}.")
    shape = _shape(model, seq_len // context_parallel_degree, micro_batch, ACT_BYTES[precision],
                   tensor_parallel_degree, sequence_parallel, context_parallel_degree)
    layer = _layer_terms(model, shape, selective=recompute == "selective")
    checkpointed = recompute in ("full", "op")
    num_ckpt = math.ceil(model.num_layers / checkpoint_interval) if checkpointed else 0
    on_gpu = min(loading_horizon, num_ckpt) if offload and num_ckpt else num_ckpt
    return ActivationEstimate(
        layer_terms=layer,
        checkpoint_bytes=shape.act * shape.t * shape.h / shape.sp_div,
        num_layers=model.num_layers,
        num_checkpointed=num_ckpt,
        num_checkpoints_on_gpu=on_gpu,
        model_terms=_model_terms(model, shape, loss_parallel=loss_parallel),
        kept_terms=_kept_terms(model, shape) if recompute == "op" else {},
        offload=offload and num_ckpt > 0,
        mlp_backward_bytes=_mlp_backward(model, shape),
    )


def _check_decoder_only(model: ModelSpec, recompute: str) -> None:
    if recompute == "op":
        raise ConfigError(
            f"{model.name}: the planner sizes op-level selective checkpointing "
            "(activation_checkpointing='selective') for decoder-only models. Plan this "
            "encoder-decoder with activation_checkpointing=True or False.")


def _encoder_decoder(model: ModelSpec, s_enc: int, s_dec: int, b: int, c: int,
                     interval: int | bool, offload: bool, horizon: int) -> ActivationEstimate:
    """Encoder-decoder models (meshtrain.plan.encdec); `interval` 0/False: no checkpointing."""
    enc_ckpt, dec_ckpt = checkpointed_blocks(model, int(interval)) if interval else (0, 0)
    dec_on_gpu = min(horizon, dec_ckpt) if offload else dec_ckpt
    enc_on_gpu = min(max(0, horizon - dec_ckpt), enc_ckpt) if offload else enc_ckpt
    return ActivationEstimate(
        layer_terms=layer_terms(model, b, s_enc, s_dec, c, decoder=True),
        checkpoint_bytes=c * b * s_dec * model.hidden_size,
        num_layers=model.num_decoder_layers, num_checkpointed=dec_ckpt,
        num_checkpoints_on_gpu=dec_on_gpu,
        model_terms=model_terms(model, b, s_enc, s_dec, c),
        encoder_layer_terms=layer_terms(model, b, s_enc, s_dec, c, decoder=False),
        num_encoder_layers=model.num_layers, encoder_checkpointed=enc_ckpt,
        encoder_checkpoints_on_gpu=enc_on_gpu,
        encoder_checkpoint_bytes=c * b * s_enc * model.hidden_size,
    )


def _shape(model: ModelSpec, s: int, b: int, act: int, tp: int, sp: bool, cp: int = 1) -> _Shape:
    return _Shape(b=b, s=s, h=model.hidden_size, a=model.num_attention_heads / tp,
                  kv=model.num_key_value_heads / tp, d=model.attention_head_dim,
                  i=model.intermediate_size / tp, v=model.vocab_size, act=act,
                  sp_div=tp if sp else 1, tp=tp, cp=cp)


def _layer_terms(model: ModelSpec, x: _Shape, *, selective: bool) -> dict[str, float]:
    if model.family == "gpt":
        return _gpt_layer(model, x, selective)
    terms = {"norms": 2 * _norm(model, x)}
    if model.family == "gpt_neox":  # parallel residual: both LayerNorms read the same input
        terms["norms"] -= x.act * x.t * x.h / x.sp_div
    terms["projection_inputs"] = 2 * x.act * x.t * x.h
    terms.update(_attention(model, x, selective))
    if model.is_moe:
        terms.update(_moe(model, x))
    else:
        per_token = 4 if model.family != "gpt_neox" else 2  # SwiGLU : GELU
        terms["mlp"] = per_token * x.act * x.t * x.i
    if model.hidden_dropout > 0:
        terms["dropout_masks"] = 2 * x.t * x.h / x.sp_div
    return terms


def _norm(model: ModelSpec, x: _Shape) -> float:
    """What one norm saves, not counting its output (the next projection saves that)."""
    if model.family == "gpt_neox":  # LayerNorm: input + fp32 mean and rstd
        return (x.act * x.t * x.h + 2 * _F32 * x.t) / x.sp_div
    # RMSNorm: fp32 input, fp32 rsqrt per token, normalised input in the compute dtype.
    return (_F32 * x.t * x.h + _F32 * x.t + x.act * x.t * x.h) / x.sp_div


def _attention(model: ModelSpec, x: _Shape, selective: bool) -> dict[str, float]:
    q = x.act * x.t * x.a * x.d
    if x.cp > 1:  # the context-parallel attention replaces eager and SDPA alike
        kv = 2 * x.act * x.t * x.kv * x.d
        return {"attention_qkv": q + kv, "attention_out": 2 * q,
                "attention_lse": _F32 * x.b * x.a * x.s}
    if model.attention == "sdpa":
        kv = 2 * x.act * x.t * x.kv * x.d
        lse = _F32 * x.b * x.a * x.s
        terms = {"attention_qkv": q + kv, "attention_out": q, "attention_lse": lse}
        if model.family == "gpt_neox":
            terms["attention_out"] += q  # transposed to (b, s, h) by a copy before `dense`
        return terms
    scores = x.b * x.a * x.s * x.s
    terms = {"attention_qkv": 3 * q, "attention_out": q}  # k, v repeated to all heads
    if not selective:
        terms["attention_scores"] = _F32 * scores + (x.act * scores if x.act != _F32 else 0)
        if model.attention_dropout > 0:
            terms["attention_scores"] += scores + x.act * scores  # mask and dropped scores
    return terms


def _kept_terms(model: ModelSpec, x: _Shape) -> dict[str, float]:
    """What an op-level selective layer keeps besides its input (module docstring)."""
    q, kv = x.act * x.t * x.a * x.d, x.act * x.t * x.kv * x.d
    # A row-wise projection's matmul gives each tp rank a partial sum of the whole width;
    # with sequence parallelism the kept reduce-scatter output (1 / t of it) is kept too.
    out = x.act * x.t * x.h * (1 + (1 / x.tp if x.sp_div > 1 else 0))
    terms = {"kept_qk": q + kv, "kept_v": kv, "kept_attention_output": out}
    if model.attention == "sdpa" and x.cp == 1:  # the fused kernel's output and log-sum-exp
        terms["kept_attention"] = q + _F32 * x.b * x.a * x.s
    if model.is_moe:
        routed = x.t * model.experts_per_token
        terms["kept_mlp"] = x.act * (x.t * model.num_experts + 2 * routed * x.i)
        terms["kept_mlp_output"] = x.act * routed * x.h
        return terms
    terms["kept_mlp"] = (2 if model.family not in ("gpt_neox", "gpt") else 1) * x.act * x.t * x.i
    terms["kept_mlp_output"] = out
    return terms


def _mlp_backward(model: ModelSpec, x: _Shape) -> float:
    """`ActivationEstimate.mlp_backward_bytes` (its docstring); for Mixtral one expert's share
    of the routed tokens, as its experts run one after another."""
    tokens = x.t * model.experts_per_token / model.num_experts if model.is_moe else x.t
    gated = model.family not in ("gpt_neox", "gpt")
    return (2 if gated else 1) * x.act * tokens * x.i


def _moe(model: ModelSpec, x: _Shape) -> dict[str, float]:
    e, k = model.num_experts, model.experts_per_token
    routed = x.t * k
    router = _F32 * x.t * e + _I64 * routed + _F32 * x.t + _F32 * routed + 2 * _I64 * routed
    experts = x.act * routed * (2 * x.h + 4 * x.i) + _F32 * routed + _I64 * routed
    return {"moe_router": router + _F32 * e, "moe_experts": experts}


def _gpt_layer(model: ModelSpec, x: _Shape, selective: bool) -> dict[str, float]:
    """Korthikanti et al. 2022, section 4.1 (Megatron's GPT layer), term by term."""
    sbh, act, tp, sp = x.t * x.h, x.act, x.tp, x.sp_div
    terms = {
        "layernorm_inputs": 2 * act * sbh / sp,
        "qkv_input": act * sbh / sp,
        "q_k": 2 * act * sbh / tp,
        "v": act * sbh / tp,
        "projection_input": act * sbh / tp,
        "mlp_input": act * sbh / sp,
        "gelu_input_output": 2 * act * x.t * x.i,
        "dropout_masks": 2 * sbh / sp,
    }
    if not selective:
        # a is already divided by t; under cp the local queries score the whole sequence
        scores = x.b * x.a * x.s * x.s * x.cp
        terms["attention_scores"] = act * scores + scores + act * scores  # softmax, mask, dropout
    return terms


def _model_terms(model: ModelSpec, x: _Shape, *, loss_parallel: bool) -> dict[str, float]:
    if model.family == "gpt":
        return {
            "embedding_dropout_mask": x.t * x.h / x.sp_div,
            "final_norm": x.act * x.t * x.h / x.sp_div,
            "head_input": x.act * x.t * x.h / x.sp_div,
            "logits_fp32": _F32 * x.t * x.v / x.tp,
        }
    return {
        "token_ids": _I64 * x.t,
        "rotary_tables": 2 * x.act * x.s * model.rotary_dim,
        "final_norm": _norm(model, x),
        "head_input": x.act * x.t * x.h,
        # HF's head gathers the logits ("colwise_gather_output"); the loss upcasts to fp32.
        "logits_fp32": _F32 * x.t * x.v / (x.tp if loss_parallel else 1),
        "labels": _I64 * x.t,
        "loss": _F32,
    }


def korthikanti_layer_bytes(
    *, seq_len: int, micro_batch: int, hidden_size: int, num_heads: int,
    tensor_parallel_degree: int = 1, sequence_parallel: bool = False,
    recompute: Recompute = "none",
) -> float:
    """The paper's closed forms (Table 2) for one GPT layer in 16-bit, for checking."""
    s, b, h, a, t = seq_len, micro_batch, hidden_size, num_heads, tensor_parallel_degree
    if recompute == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    scores = 0 if recompute == "selective" else 5 * a * s / h
    if sequence_parallel:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


__all__ = ["ACT_BYTES", "RECOMPUTE_FOR_POLICY", "ActivationEstimate", "activation_bytes",
           "korthikanti_layer_bytes"]
