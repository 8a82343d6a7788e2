"""Memory per GPU phase by phase: what torch and FSDP2 hold at each phase's high-water mark.

One training step of the runtime's layout (``transform()``: an FSDP2 group per block, one for
the input embedding, one for the output head that is not resharded after forward, the root
for the rest; under expert parallelism the experts of each block first, as their own group)
passes through four phases. Each phase's figure is the sum of what is allocated at its worst
moment; the step's peak is the largest phase.

Always there (steady state, from the second step on): the sharded parameters in their own
dtype (fp32: FSDP2 keeps the fp32 shard and casts a copy for compute) and the optimizer's
states. The sharded gradients exist only from backward to the end of the optimizer step:
``zero_grad(set_to_none=True)`` (torch's default) frees them after every step.

- **forward**: at the end of the last block's forward. Saved activations of every block (or
  their checkpoints, and the running checkpointed block's MLP intermediates, freed as they
  are used), the unsharded compute-dtype parameters of the block running, and its
  flat all-gather buffer, which FSDP2 keeps until the next group's copy-out (the "implicit
  prefetch" that overlaps one all-gather with the next copy-out): two blocks' worth.
- **loss**: the output head runs and the loss is computed. HF's causal-LM loss upcasts the
  logits to fp32 and ``cross_entropy`` keeps the fp32 log-softmax for backward. Worst of two
  moments: (a) forward of the loss: compute-dtype logits + their fp32 copy + the
  log-softmax, with the head's unsharded parameters and its still-held flat all-gather
  buffer; (b) the first backward kernels: the log-softmax, the gradient ``nll_loss`` writes
  into and the gradient ``log_softmax`` returns (3 fp32 [tokens, vocab]), with the head's
  unsharded parameters (not resharded after forward); the flat buffer and the
  compute-dtype logits are gone (the root's post-forward frees the one, nobody holds the
  other once the loss is returned).
- **backward**: the first block in backward. Worst of (a) its start: every activation still
  saved (a checkpointed block's recomputed activations too), this block's unsharded
  parameters and the next block's (prefetched: its flat all-gather buffer), the head's fp32
  reduce-scatter input, which FSDP2 keeps until the next group's reduce starts, and the
  gradients flowing through the block; (b) its end: its own activations freed, its unsharded
  gradients complete (compute dtype) beside the same buffers; (c) its reduce: unsharded
  gradients and their fp32 reduce-scatter input (the parameters are resharded first).
- **optimizer step**: the states, the complete sharded gradients and, for torch's default
  (foreach) AdamW, one fp32 temporary the size of the local parameters (``_foreach_sqrt`` of
  the second moment); ``fused=True`` needs none.

``cpu_offload`` is FSDP2's ``CPUOffloadPolicy``: sharded parameters, gradients, optimizer
states and the step run in host memory; the unsharded buffers stay on the GPU. Optimizer-only
offload (a script's own host-side optimizer, not a layout the runtime builds) moves only the
optimizer states and its step.

``reshard_after_forward`` (the runtime's key; by default the strategy's choice) decides whether
a group frees its unsharded parameters once its forward is done. False keeps every group's
unsharded parameters from its forward to its backward: ``shard_grad_op`` (ZeRO-2; also the
runtime's nearest layout to ZeRO-1), ``_hybrid_shard_zero2`` and ``no_shard`` (one rank, or a
shard group of one) by default, or any strategy with ``reshard_after_forward: false``. True frees
them (the output head and the root stay gathered: backward starts with them), and the
first block in backward then gathers again with the next one prefetched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.plan.activations import ActivationEstimate
from meshtrain.plan.encdec import decoder_seq_len, encdec_groups
from meshtrain.plan.memory import (
    OPTIMIZER_STATE_BYTES,
    REDUCE_BYTES,
    Training,
    expert_shard_degree,
    group_shard_elements,
)
from meshtrain.plan.models import ModelSpec, param_groups

PHASES = ("forward", "loss", "backward", "optimizer_step")
Offload = Literal["none", "cpu_offload", "optimizer"]
_F32 = 4
_PARAM_BYTES = 4
"""FSDP2 keeps parameters (and so their sharded gradients) in the model's dtype: fp32."""
RESIDENT_TERMS = ("sharded_parameters", "optimizer_states", "sharded_gradients", "activations")
"""Terms that are model states or saved activations; the rest are a phase's buffers."""
_BEFORE_BLOCKS = ("token_ids", "rotary_tables", "labels", "embedding_dropout_mask",
                  "decoder_token_ids", "relative_position_buckets", "encoder_final_norm",
                  "encoder_output", "cross_attention_bias", "position_ids",
                  "embedding_norms")
"""Model terms that exist before the last block runs (for encoder-decoders: the encoder's)."""


@dataclass(frozen=True)
class PhaseMemory:
    """One phase's bytes on the GPU at its high-water mark, by what holds them."""

    name: str
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def largest_term(self) -> str:
        return max(self.terms, key=lambda key: self.terms[key])


@dataclass(frozen=True)
class FSDPGroups:
    """Unsharded elements (FSDP2-padded) one rank gathers per group, after TP and EP."""

    embedding: int
    block: int
    """One block's dense part (everything but routed experts under expert parallelism)."""
    experts: int
    """One block's local experts when they form their own group (expert parallelism)."""
    head: int
    root: int
    num_blocks: int
    sharded: int
    """Elements of every group's shard on this rank (the model states' element count)."""
    largest_shard: int
    """Elements of the largest single parameter shard on this rank."""
    all_blocks: int = 0
    """Unsharded elements of every block together (blocks of an encoder-decoder differ)."""
    single: bool = False
    """A shard group of one (no_shard): FSDP2 copies shards into the unsharded parameters
    without an all-gather or a flat buffer, and reduces without a collective."""

    @property
    def block_total(self) -> int:
        return self.block + self.experts


def fsdp_groups(model: ModelSpec, degrees: ResolvedDegrees) -> FSDPGroups:
    """The groups `transform()` builds and their sizes on one rank.

    A tied input embedding lives in the root group (FSDP2 cannot put one parameter in two
    groups). `largest_layer_params` overrides one block's size (for models whose blocks differ,
    or when only the parameter count is known), scaled by tensor parallelism.
    """
    tp, ep, shard = (degrees.tensor_parallel_degree, degrees.expert_parallel_degree,
                     degrees.hybrid_shard_degree)
    sizes = {"embedding": 0, "layer": 0, "experts": 0, "head": 0, "root": 0}
    sharded = largest = 0
    for group in param_groups(model):
        one = group_shard_elements(group, tp=tp, ep=ep, shard=shard)
        largest = max(largest, one)
        local = group.count * one
        sharded += local
        width = expert_shard_degree(shard, tp, ep) if group.expert else shard
        unit = "experts" if group.expert and ep > 1 else group.unit
        if unit == "embedding" and model.tie_word_embeddings:
            unit = "root"
        sizes[unit] += local * width
    blocks = model.num_blocks
    block = sizes["layer"] / blocks
    if model.is_encoder_decoder:  # a decoder block (cross-attention too) is the largest
        block = sum(group_shard_elements(g, tp=tp, ep=ep, shard=shard) * g.count * shard
                    for g in encdec_groups(model, decoder_block_only=True))
    if model.largest_layer_params is not None:
        block = model.largest_layer_params / tp
    return FSDPGroups(embedding=sizes["embedding"], block=math.ceil(block),
                      experts=math.ceil(sizes["experts"] / blocks), head=sizes["head"],
                      root=sizes["root"], num_blocks=blocks, sharded=sharded,
                      largest_shard=largest, all_blocks=sizes["layer"] + sizes["experts"],
                      single=shard == 1)


@dataclass(frozen=True)
class _Step:
    """The byte sizes the phases are made of (one rank)."""

    c: int  # compute dtype
    groups: FSDPGroups
    fsdp: bool
    keep_gathered: bool
    """Groups keep their unsharded parameters from forward to backward
    (``reshard_after_forward`` False)."""
    states: dict[str, float]
    gradients: float
    step_buffer: float
    scratch: bool
    """CPU ranks (gloo): every all-gather and reduce-scatter copies its full buffer once (a
    shard group of one runs neither)."""


def _step_buffer(groups: FSDPGroups, training: Training, on_gpu: bool) -> float:
    """torch's AdamW defaults to foreach on CUDA: ``_foreach_sqrt`` of every second moment at
    once (4 B per local parameter). On CPU it defaults to the per-tensor loop, whose
    ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` briefly holds two fp32 copies of one tensor.
    Fused AdamW and optimizers without a second moment need none."""
    if OPTIMIZER_STATE_BYTES[training.optimizer] < 8 or training.fused_optimizer:
        return 0.0
    return _F32 * groups.sharded if on_gpu else 2 * _F32 * groups.largest_shard


def _step(model: ModelSpec, degrees: ResolvedDegrees, training: Training,
          offload: Offload, uses_fsdp: bool, on_gpu: bool, reshard: bool | None) -> _Step:
    groups = fsdp_groups(model, degrees)
    moments = OPTIMIZER_STATE_BYTES[training.optimizer]
    on_gpu_params = offload != "cpu_offload"
    on_gpu_optimizer = offload == "none"
    states = {
        "sharded_parameters": _PARAM_BYTES * groups.sharded if on_gpu_params else 0.0,
        "optimizer_states": moments * groups.sharded if on_gpu_optimizer else 0.0,
    }
    return _Step(c=training.compute_bytes if uses_fsdp else _PARAM_BYTES, groups=groups,
                 fsdp=uses_fsdp,
                 keep_gathered=not (degrees.reshard_after_forward if reshard is None
                                    else reshard),
                 states=states,
                 gradients=_PARAM_BYTES * groups.sharded if on_gpu_params else 0.0,
                 step_buffer=_step_buffer(groups, training, on_gpu) if on_gpu_optimizer
                 else 0.0, scratch=not on_gpu and degrees.hybrid_shard_degree > 1)


def phase_memory(
    model: ModelSpec,
    degrees: ResolvedDegrees,
    training: Training,
    activations: ActivationEstimate,
    *,
    offload: Offload = "none",
    uses_fsdp: bool = True,
    loss_parallel: bool = False,
    on_gpu: bool = True,
    reshard_after_forward: bool | None = None,
) -> list[PhaseMemory]:
    """The four phases of one step on one rank (see the module docstring).

    `uses_fsdp` is False only where the runtime skips FSDP (one data-parallel rank under
    tensor or pipeline parallelism, fp32, no offload: see
    `meshtrain_runtime.parallelize.uses_fsdp`); `loss_parallel` keeps the
    logits split over the vocabulary; `on_gpu` False plans CPU ranks (the optimizer's
    per-tensor loop, see `_step_buffer`); `reshard_after_forward` is the runtime's key resolved
    (None: the strategy's default, `degrees.reshard_after_forward`).
    """
    step = _step(model, degrees, training, offload, uses_fsdp, on_gpu, reshard_after_forward)
    tokens_vocab = _tokens_vocab(model, degrees, training, loss_parallel)
    return [
        PhaseMemory("forward", step.states | _forward_terms(step, activations)),
        PhaseMemory("loss", step.states | _loss_terms(step, activations, tokens_vocab)),
        PhaseMemory("backward", step.states | _backward_terms(step, model, degrees, training,
                                                              activations)),
        PhaseMemory("optimizer_step", step.states | {"sharded_gradients": step.gradients,
                                                     "optimizer_step_buffer": step.step_buffer}),
    ]


def _tokens_vocab(model: ModelSpec, degrees: ResolvedDegrees, training: Training,
                  loss_parallel: bool) -> float:
    tokens = training.micro_batch * decoder_seq_len(model, training) \
        / degrees.context_parallel_degree
    vocab = model.vocab_size / (degrees.tensor_parallel_degree if loss_parallel else 1)
    return tokens * vocab


def _model_terms(acts: ActivationEstimate, *, before_blocks: bool) -> float:
    return sum(v for k, v in acts.model_terms.items() if (k in _BEFORE_BLOCKS) == before_blocks)


def _block_activations(acts: ActivationEstimate) -> float:
    return acts.total_bytes - sum(acts.model_terms.values())


def _gathered_in_forward(step: _Step, *, at_head: bool) -> float:
    """Unsharded parameters held while a block (or, `at_head`, the output head) computes in
    forward: its own, its flat all-gather buffer (kept until the next copy-out; none in a
    shard group of one) and the root's; when groups keep their parameters gathered
    (``reshard_after_forward`` False) every group gathered so far as well."""
    if not step.fsdp:
        return 0.0
    g = step.groups
    current = g.head if at_head else g.block_total
    flat = 0 if g.single else current
    if step.keep_gathered:
        running = g.embedding + g.all_blocks + (g.head if at_head else 0)
        return step.c * (g.root + flat + running)
    return step.c * (g.root + flat + current)


def _mlp_terms(acts: ActivationEstimate) -> float:
    return acts.layer_terms.get("mlp", acts.layer_terms.get("moe_experts",
                                                            acts.layer_terms.get(
                                                                "gelu_input_output", 0.0)))


def _worst(moments: list[dict[str, float]]) -> dict[str, float]:
    return max(moments, key=lambda terms: sum(terms.values()))


def _forward_terms(step: _Step, acts: ActivationEstimate) -> dict[str, float]:
    """End of the last block's forward; on CPU ranks also its all-gather, which gloo runs
    through a temporary copy of the gathered buffer (the previous block's activations are
    all there, the running block's not yet)."""
    saved = _block_activations(acts) + _model_terms(acts, before_blocks=True)
    gathered = _gathered_in_forward(step, at_head=False)
    # A checkpointed block saves nothing but its input; what it computes is freed once used.
    # Its high-water mark is its MLP, whose [tokens, intermediate] tensors (gate, its
    # activation, up, their product) exist together when the down projection runs.
    running = _mlp_terms(acts) if acts.num_checkpointed else 0.0
    moments = [{"activations": saved, "recomputed_activations": running,
                "gathered_parameters": gathered}]
    if step.scratch and step.fsdp:
        scratch = step.c * step.groups.block_total
        previous = saved - (acts.checkpoint_bytes if running else acts.layer_bytes)
        moments.append({"activations": previous, "gathered_parameters": gathered,
                        "collective_scratch": scratch})
    return _worst(moments)


def _loss_terms(step: _Step, acts: ActivationEstimate, tokens_vocab: float) -> dict[str, float]:
    """Worst of the loss's forward, its first backward kernels, the cast of the logits'
    gradient back to the compute dtype, and the head's pre-backward, which prefetches the
    last block (its flat all-gather buffer; on CPU ranks with gloo's copy) before the
    head's own backward (module docstring)."""
    c, g = step.c, step.groups
    activations = acts.total_bytes  # incl. the fp32 log-softmax (model_terms["logits_fp32"])
    log_softmax = acts.model_terms.get("logits_fp32", acts.model_terms.get("log_softmax", 0.0))
    # T5 takes the loss of the compute-dtype logits; HF's causal LMs upcast them to fp32, and
    # BART's fp32 final_logits_bias promotes them (its model_terms say logits_fp32).
    lb = c if "log_softmax" in acts.model_terms else _F32
    forward_gathered = _gathered_in_forward(step, at_head=True)
    gathered = forward_gathered - (c * g.head if step.fsdp else 0.0)
    upcast = c * tokens_vocab + (lb * tokens_vocab if c != lb else 0.0)
    moments = [
        {"activations": activations, "gathered_parameters": forward_gathered,
         "loss_temporaries": upcast},
        {"activations": activations, "gathered_parameters": gathered,
         "loss_temporaries": 2 * lb * tokens_vocab},
        {"activations": activations - log_softmax, "gathered_parameters": gathered,
         "loss_temporaries": upcast},
    ]
    if step.fsdp and not step.keep_gathered and g.head:
        # The group that finished its forward last: a block's dense part (its experts, a
        # group of their own under expert parallelism, finished before it). A head tied into
        # the root has no pre-backward of its own: the block unshards in backward.
        prefetch = {"activations": activations - log_softmax,
                    "gathered_parameters": gathered + c * g.block,
                    "loss_temporaries": c * tokens_vocab}
        if step.scratch:
            prefetch["collective_scratch"] = c * g.block
        moments.append(prefetch)
    return _worst(moments)


def _backward_terms(step: _Step, model: ModelSpec, degrees: ResolvedDegrees,
                    training: Training, acts: ActivationEstimate) -> dict[str, float]:
    """Worst of the first block's backward start, end and reduce (module docstring); on CPU
    ranks gloo's all-gather and reduce-scatter each hold a copy of their full buffer."""
    g, c = step.groups, step.c
    saved = _block_activations(acts) + _model_terms(acts, before_blocks=True)
    recompute = acts.recompute_working_bytes
    flowing = c * training.micro_batch * decoder_seq_len(model, training) \
        * model.hidden_size / degrees.context_parallel_degree
    head_grads = (_PARAM_BYTES * g.head / degrees.hybrid_shard_degree) if step.gradients else 0.0
    if not step.fsdp:  # plain tensor parallelism: gradients in the parameters' own dtype
        # Mid-block: the MLP's weight gradients are written while its activations are still
        # saved, and two [tokens, intermediate] gradients (of the SwiGLU product's factors)
        # flow; the block's weights are mostly the MLP's.
        tokens = training.micro_batch * training.seq_len / degrees.context_parallel_degree
        intermediate = model.intermediate_size / degrees.tensor_parallel_degree
        mlp_weights = min(g.block_total, 3 * model.hidden_size * intermediate)
        return _worst([{"activations": saved, "recomputed_activations": recompute,
                        "gradient_flow": flowing + 2 * c * tokens * intermediate,
                        "sharded_gradients": head_grads + _PARAM_BYTES * mlp_weights},
                       {"sharded_gradients": step.gradients}])
    block = c * g.block_total
    gathered = c * g.root + 2 * block
    if step.keep_gathered:
        gathered = c * (g.root + g.embedding + g.all_blocks)
    head_reduce = REDUCE_BYTES * g.head
    block_reduce = REDUCE_BYTES * g.block_total
    # A checkpointed block's recomputed activations replace its own (freed as backward runs).
    rest = saved + recompute - (recompute or acts.layer_bytes)
    moments = [
        {"activations": saved, "recomputed_activations": recompute,
         "gathered_parameters": gathered, "reduce_scatter_buffers": head_reduce,
         "gradient_flow": flowing},
        {"activations": rest, "gathered_parameters": gathered, "unsharded_gradients": block,
         "reduce_scatter_buffers": head_reduce},
        {"activations": rest, "gathered_parameters": gathered - block,
         "unsharded_gradients": block, "reduce_scatter_buffers": block_reduce},
    ]
    if step.scratch:
        moments[0]["collective_scratch"] = block
        moments[2]["collective_scratch"] = block_reduce
    terms = _worst(moments) | {"sharded_gradients": head_grads}
    if not g.head and step.gradients:
        # A head tied into the root: the root's unsharded gradient (the head's weight gradient)
        # is written in the loss's backward and reduced only when the root's backward ends.
        terms["unsharded_gradients"] = terms.get("unsharded_gradients", 0.0) + c * g.root
    return terms


def peak_phase(phases: list[PhaseMemory]) -> PhaseMemory:
    """The phase with the most bytes (the first of equals)."""
    return max(phases, key=lambda phase: phase.total)


__all__ = ["PHASES", "RESIDENT_TERMS", "FSDPGroups", "Offload", "PhaseMemory", "fsdp_groups",
           "peak_phase", "phase_memory"]
