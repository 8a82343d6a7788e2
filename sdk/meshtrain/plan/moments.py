"""The moments each phase's figure is the worst of: what torch, FSDP2 and CUDA hold then.

meshtrain.plan.phases says what the phases are; this module sizes their moments on one rank.
Each term names the mechanism it stands for and where torch does it (torch 2.11 / 2.13; the
committed H200 table, benchmarks/results/gpu-nvidia-h200-2026-11-27.json, measures them):

- **Copy-in of a shard group of one** (``FSDPParamGroup.wait_for_unshard``, its
  ``world_size == 1`` branch, and ``FSDPParam.all_gather_inputs``): with no all-gather, each
  parameter's shard is cast to the compute dtype (``_to_dtype_if_needed``: a temporary the
  size of the parameter) and copied into its unsharded storage; under ``cpu_offload`` the fp32
  shard is first copied to the device (``sharded_param_data.to(device)``), so the copy and its
  cast exist together before the unsharded storage is made. The output head, one parameter,
  does this in its pre-forward: the moment the forward phase ends on.
- **Sharded gradients pile up in backward** (``foreach_reduce``: the reduce-scatter output is
  the group's sharded fp32 gradient, kept until the optimizer step): every group reduced
  before the last block in backward holds its sharded gradient then. Over a shard group of
  one (or a few ranks) that is most of the model's fp32 gradients, so the last block in
  backward, not the first, is backward's worst moment.
- **The MLP's backward** (autograd's ``MulBackward0`` of SwiGLU's product): the product's
  gradient, the gate activation's and up's gradients and the output projection's weight
  gradient are alive at once, above the block's saved tensors
  (`ActivationEstimate.mlp_backward_bytes`).
- **Activation offloading** (meshtrain_runtime.parallel.offload): every checkpointed block's
  input is on the host until the root forward ends; then the loading horizon's come back.
- **The caching allocator's blocks** (c10/cuda/CUDACachingAllocator.cpp, ``round_size``):
  every allocation takes a multiple of 512 bytes, so the 4-byte loss a training loop holds
  through the optimizer step takes 512 (`allocated_block`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshtrain.plan.activations import ActivationEstimate
from meshtrain.plan.groups import FSDPGroups
from meshtrain.plan.memory import REDUCE_BYTES

_F32 = 4
PARAM_BYTES = 4
"""FSDP2 keeps parameters (and so their sharded gradients) in the model's dtype: fp32."""
CUDA_BLOCK_BYTES = 512
"""The CUDA caching allocator's smallest block (kMinBlockSize): sizes round up to it."""
BEFORE_BLOCKS = ("token_ids", "rotary_tables", "labels", "embedding_dropout_mask",
                 "decoder_token_ids", "relative_position_buckets", "encoder_final_norm",
                 "encoder_output", "cross_attention_bias", "position_ids",
                 "embedding_norms")
"""Model terms that exist before the last block runs (for encoder-decoders: the encoder's)."""
AFTER_HEAD = ("logits_fp32", "log_softmax", "loss")
"""Model terms the output head and the loss make (everything else exists at the head)."""


def allocated_block(nbytes: float, on_gpu: bool) -> float:
    """What an allocation of `nbytes` takes: on a GPU, whole 512-byte blocks."""
    return math.ceil(nbytes / CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES if on_gpu else nbytes


@dataclass(frozen=True)
class StepSizes:
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
    cpu_offload: bool = False
    on_gpu: bool = True


def model_terms(acts: ActivationEstimate, *, before_blocks: bool) -> float:
    return sum(v for k, v in acts.model_terms.items() if (k in BEFORE_BLOCKS) == before_blocks)


def _block_activations(acts: ActivationEstimate) -> float:
    return acts.total_bytes - sum(acts.model_terms.values())


def gathered_in_forward(step: StepSizes, *, at_head: bool) -> float:
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


def _worst(moments: list[dict[str, float]]) -> dict[str, float]:
    return max(moments, key=lambda terms: sum(terms.values()))


# --- forward ---------------------------------------------------------------------------------
def forward_terms(step: StepSizes, acts: ActivationEstimate) -> dict[str, float]:
    """Worst of the last block's forward, the head's pre-forward (its copy-in) and, on CPU
    ranks, the last block's all-gather, which gloo runs through a temporary copy of the
    gathered buffer (the previous block's activations are all there, the running block's not
    yet)."""
    offloaded = acts.total_bytes - acts.forward_bytes
    saved = _block_activations(acts) - offloaded + model_terms(acts, before_blocks=True)
    gathered = gathered_in_forward(step, at_head=False)
    # A checkpointed block saves its input (and, selective, its kept op outputs); what else it
    # computes is freed once used. Its high-water mark is its MLP: the [tokens, intermediate]
    # tensors (gate, its activation, up, their product) exist together when the down
    # projection runs.
    running = acts.running_bytes
    moments = [{"activations": saved, "recomputed_activations": running,
                "gathered_parameters": gathered}]
    if step.scratch and step.fsdp:
        scratch = step.c * step.groups.block_total
        last = (acts.checkpoint_bytes + acts.kept_bytes) if acts.num_checkpointed \
            else acts.layer_bytes
        moments.append({"activations": saved - last, "gathered_parameters": gathered,
                        "collective_scratch": scratch})
    moments.append(_head_pre_forward(step, acts, saved))
    return _worst(moments)


def _head_pre_forward(step: StepSizes, acts: ActivationEstimate,
                      saved: float) -> dict[str, float]:
    """The output head's pre-forward, where the meter's forward phase ends: every block's
    saved tensors, the final norm's and the head's input, every group gathered so far with
    the head, and the head's copy-in (module docstring)."""
    g = step.groups
    moment = {"activations": saved + sum(v for k, v in acts.model_terms.items()
                                         if k not in BEFORE_BLOCKS + AFTER_HEAD),
              "gathered_parameters": gathered_in_forward(step, at_head=True)}
    if step.fsdp and g.head and g.single:
        cast = step.c if step.c != PARAM_BYTES else 0  # no cast without mixed precision
        device_copy = PARAM_BYTES if step.cpu_offload else 0
        moment["copy_in_buffers"] = max(cast, device_copy) * g.head
    elif step.scratch and step.fsdp and g.head:
        moment["collective_scratch"] = step.c * g.head
    return moment


# --- loss ------------------------------------------------------------------------------------
def loss_terms(step: StepSizes, acts: ActivationEstimate, tokens_vocab: float) -> dict[str, float]:
    """Worst of the loss's forward, its first backward kernels, the cast of the logits'
    gradient back to the compute dtype, and the head's pre-backward, which prefetches the
    last block (its flat all-gather buffer; on CPU ranks with gloo's copy) before the
    head's own backward (meshtrain.plan.phases)."""
    c, g = step.c, step.groups
    activations = acts.total_bytes  # incl. the fp32 log-softmax (model_terms["logits_fp32"])
    log_softmax = acts.model_terms.get("logits_fp32", acts.model_terms.get("log_softmax", 0.0))
    # T5 takes the loss of the compute-dtype logits; HF's causal LMs upcast them to fp32, and
    # BART's fp32 final_logits_bias promotes them (its model_terms say logits_fp32).
    lb = c if "log_softmax" in acts.model_terms else _F32
    forward_gathered = gathered_in_forward(step, at_head=True)
    # the head's flat all-gather buffer is freed by the root's post-forward (a shard group of
    # one has none: its unsharded head stays, not resharded after forward)
    gathered = forward_gathered - (c * g.head if step.fsdp and not g.single else 0.0)
    upcast = c * tokens_vocab + (lb * tokens_vocab if c != lb else 0.0)
    moments = [
        {"activations": activations, "gathered_parameters": forward_gathered,
         "loss_temporaries": upcast},
        {"activations": activations, "gathered_parameters": gathered,
         "loss_temporaries": 2 * lb * tokens_vocab},
        {"activations": activations - log_softmax, "gathered_parameters": gathered,
         "loss_temporaries": upcast},
    ]
    if step.fsdp and not step.keep_gathered and g.head and not g.single:
        # The group that finished its forward last: a block's dense part (its experts, a
        # group of their own under expert parallelism, finished before it). A head tied into
        # the root has no pre-backward of its own: the block unshards in backward. A shard
        # group of one prefetches nothing (its copy-in waits for the block's pre-backward).
        prefetch = {"activations": activations - log_softmax,
                    "gathered_parameters": gathered + c * g.block,
                    "loss_temporaries": c * tokens_vocab}
        if step.scratch:
            prefetch["collective_scratch"] = c * g.block
        moments.append(prefetch)
    return _worst(moments)


# --- backward --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BackwardSizes:
    """What backward's moments need besides the step's sizes (one rank)."""

    flowing: float
    """The gradient of the hidden states flowing through the blocks."""
    mlp_weight_gradient: float
    """The MLP output projection's unsharded weight gradient (compute dtype)."""
    head_gradient: float
    """The head's sharded fp32 gradient (0 when gradients live in host memory)."""
    mlp_intermediate: float
    """Without FSDP: two [tokens, intermediate] gradients (the no-FSDP branch's moment)."""
    mlp_weights: float
    """Without FSDP: the block's MLP weights (their gradients are written mid-block)."""


def backward_terms(step: StepSizes, acts: ActivationEstimate,
                   sizes: BackwardSizes) -> dict[str, float]:
    """Worst of the first block's backward (start, mid-MLP, end, reduce) and the last block's
    (mid-MLP, with every gradient reduced before it); on CPU ranks gloo's all-gather (at the
    start: the next block's prefetch) and reduce-scatter each hold a copy of their full
    buffer."""
    g, c = step.groups, step.c
    saved = _block_activations(acts) + model_terms(acts, before_blocks=True)
    recompute = acts.recompute_working_bytes
    if not step.fsdp:  # plain tensor parallelism: gradients in the parameters' own dtype
        # Mid-block: the MLP's weight gradients are written while its activations are still
        # saved, and two [tokens, intermediate] gradients (of the SwiGLU product's factors)
        # flow; the block's weights are mostly the MLP's.
        return _worst([{"activations": saved, "recomputed_activations": recompute,
                        "gradient_flow": sizes.flowing + sizes.mlp_intermediate,
                        "sharded_gradients": sizes.head_gradient
                        + PARAM_BYTES * sizes.mlp_weights},
                       {"sharded_gradients": step.gradients}])
    block = c * g.block_total
    gathered = c * g.root + 2 * block
    if step.keep_gathered:
        gathered = c * (g.root + g.embedding + g.all_blocks)
    head_reduce = REDUCE_BYTES * g.head
    block_reduce = REDUCE_BYTES * g.block_total
    # A checkpointed block's recomputed activations replace its own (freed as backward runs).
    rest = saved + recompute - (recompute or acts.layer_bytes)
    start = {"activations": saved, "recomputed_activations": recompute,
             "gathered_parameters": gathered, "reduce_scatter_buffers": head_reduce,
             "gradient_flow": sizes.flowing}
    moments = [
        start,
        start | {"gradient_flow": sizes.flowing + acts.mlp_backward_bytes,
                 "unsharded_gradients": sizes.mlp_weight_gradient},  # mid-MLP
        {"activations": rest, "gathered_parameters": gathered, "unsharded_gradients": block,
         "reduce_scatter_buffers": head_reduce},
        {"activations": rest, "gathered_parameters": gathered - block,
         "unsharded_gradients": block, "reduce_scatter_buffers": block_reduce},
    ]
    if step.scratch:
        if not step.keep_gathered:  # gloo's copy of the next block's all-gather (prefetch)
            start["collective_scratch"] = block
        moments[3]["collective_scratch"] = block_reduce
    worst = _worst(moments) | {"sharded_gradients": sizes.head_gradient}
    if not g.head and step.gradients:
        # A head tied into the root: the root's unsharded gradient (the head's weight gradient)
        # is written in the loss's backward and reduced only when the root's backward ends.
        worst["unsharded_gradients"] = worst.get("unsharded_gradients", 0.0) + c * g.root
    if g.num_blocks < 2:
        return worst
    return _worst([worst, _last_block(step, acts, sizes)])


def _last_block(step: StepSizes, acts: ActivationEstimate,
                sizes: BackwardSizes) -> dict[str, float]:
    """The last block in backward (block 0), mid-MLP: its own activations (recomputed when
    checkpointed; its input back from the host when offloaded), the previous block's fp32
    reduce-scatter input (held until this block reduces), this block unsharded (with the
    embedding: kept gathered, or its flat all-gather buffer prefetched), and the sharded fp32
    gradients of every group reduced before it (module docstring)."""
    g, c = step.groups, step.c
    # block 0 is checkpointed whenever any block is (blocks 0, n, 2n, ...)
    own = acts.checkpoint_bytes + acts.kept_bytes if acts.num_checkpointed else acts.layer_bytes
    before = model_terms(acts, before_blocks=True)
    embedding = g.embedding if (step.keep_gathered or not g.single) else 0
    reduced = g.head + (g.num_blocks - 1) * g.block_total
    gradients = PARAM_BYTES * reduced / g.shard if step.gradients else 0.0
    return {"activations": own + before,
            "recomputed_activations": acts.recompute_working_bytes,
            "gathered_parameters": c * (g.root + embedding + g.block_total),
            "reduce_scatter_buffers": REDUCE_BYTES * g.block_total,
            "gradient_flow": sizes.flowing + acts.mlp_backward_bytes,
            "unsharded_gradients": sizes.mlp_weight_gradient,
            "sharded_gradients": gradients}


__all__ = ["AFTER_HEAD", "BEFORE_BLOCKS", "CUDA_BLOCK_BYTES", "PARAM_BYTES", "BackwardSizes",
           "StepSizes", "allocated_block", "backward_terms", "forward_terms",
           "gathered_in_forward", "loss_terms", "model_terms"]
