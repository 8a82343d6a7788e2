"""Communication bytes each GPU sends per optimizer step, and a rough time for them.

Ring algorithms (what NCCL and gloo run), for a message of M bytes over n ranks, each rank sends:

- all-reduce ``2 (n-1)/n * M``; reduce-scatter and all-gather ``(n-1)/n * M`` (M = the full,
  unsharded size); all-to-all ``(n-1)/n * M`` (M = what one rank holds, uniform routing).

Per step (one micro-batch each, as the runtime runs it):

- FSDP: all-gather the compute-dtype parameters in forward, and again in backward when units
  reshard after forward (full_shard, hybrid_shard, or ``reshard_after_forward: true``; the
  output head and the root never do:
  FSDP2 keeps the root unit gathered from forward to backward); reduce-scatter
  fp32 gradients; with replicas, all-reduce the gradient shards over the replicate group.
  Expert tensors do this over ``shard / ep`` ranks (``shard x t / ep`` with TP x EP).
- Tensor parallelism, per layer: 2 all-reduces of the (b, s, h) activations in forward and 2 in
  backward, or with sequence parallelism an all-gather and a reduce-scatter in place of each
  (the same volume). Full recomputation repeats the forward ones up to the last tensor backward
  needs: torch's non-reentrant checkpoint stops there, so the MLP's output collective (read only
  by the residual add, which saves nothing) is not repeated: one more all-reduce per layer, or
  with sequence parallelism two all-gathers and a reduce-scatter. Op-level selective
  recomputation keeps the reduce-scatter's output (meshtrain_runtime.parallel.selective), so
  with sequence parallelism it repeats the two all-gathers only. The HF output head gathers
  the logits (b, s, V / t each) in forward and all-reduces its input gradient in backward; the
  vocab-parallel input embedding all-reduces its output in forward. With loss parallelism the
  logits stay split and the cross entropy all-reduces three fp32 numbers per token instead.
  With sequence parallelism the gradients of the vectors TP keeps whole (norm weights, row-wise
  biases) are partial sums over the sequence shards: one more all-reduce of their size.
- Expert parallelism, per MoE layer: dispatch and combine all-to-alls in forward and backward;
  with TP x EP each tp rank dispatches 1/t of the tokens, and the outputs (forward) and input
  gradients (backward) are all-gathered over tp.
- Context parallelism, per layer, by ``cp_comm_type``: the ring's (p2p) sends of k, v and
  their gradients, all_gather's all-gather of k and v and reduce-scatter of their gradients, or
  a2a's all-to-alls of q, k, v and the output (derived in meshtrain.plan.context).

Rank layout (meshtrain's contract): replicate x shard x tp with TP innermost, so a TP group is
``t`` consecutive ranks, a shard group ``S`` ranks ``t`` apart, a replicate group ``R`` ranks
``S t`` apart; EP and CP groups are carved out of the shard group (stride ``t``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.plan.cluster import Cluster
from meshtrain.plan.context import context_layer_bytes
from meshtrain.plan.encdec import decoder_seq_len, encdec_flops
from meshtrain.plan.memory import (
    REDUCE_BYTES,
    Training,
    expert_shard_degree,
    group_shard_elements,
)
from meshtrain.plan.models import ModelSpec, param_groups

_F32 = 4


def all_reduce_bytes(n: int, message: float) -> float:
    """Bytes each rank sends in a ring all-reduce of `message` bytes over `n` ranks."""
    return 2 * (n - 1) / n * message


def reduce_scatter_bytes(n: int, message: float) -> float:
    """Bytes each rank sends reducing a full `message` into n shards (also all-gather's)."""
    return (n - 1) / n * message


all_gather_bytes = reduce_scatter_bytes


def all_to_all_bytes(n: int, message: float) -> float:
    """Bytes each rank sends exchanging its `message` evenly with n - 1 others."""
    return (n - 1) / n * message


@dataclass(frozen=True)
class CommVolumes:
    """Bytes one GPU sends per step, by collective."""

    fsdp_all_gather: float = 0.0
    fsdp_reduce_scatter: float = 0.0
    data_parallel_all_reduce: float = 0.0
    tensor_parallel: float = 0.0
    expert_all_to_all: float = 0.0
    context_parallel: float = 0.0
    pipeline_p2p: float = 0.0
    """Pipeline parallelism: activations and gradients sent to the neighbouring stages."""

    @property
    def total(self) -> float:
        return (self.fsdp_all_gather + self.fsdp_reduce_scatter + self.data_parallel_all_reduce
                + self.tensor_parallel + self.expert_all_to_all + self.context_parallel
                + self.pipeline_p2p)


def _local_elements(model: ModelSpec, degrees: ResolvedDegrees) -> tuple[float, float, float]:
    """(non-expert, expert, head and root) parameter elements on one rank before FSDP, as FSDP2
    gathers and reduces them: padded to ``shard x ceil(rows / shard)`` rows."""
    tp, ep = degrees.tensor_parallel_degree, degrees.expert_parallel_degree
    shard = degrees.hybrid_shard_degree
    dense = expert = gathered_once = 0.0
    for group in param_groups(model):
        group_shard = expert_shard_degree(shard, tp, ep) if group.expert else shard
        numel = group_shard * group_shard_elements(group, tp=tp, ep=ep, shard=shard) * group.count
        if group.expert:
            expert += numel
        else:
            dense += numel
            gathered_once += numel if group.unit in ("head", "root") else 0.0
    return dense, expert, gathered_once


def communication_volumes(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, *,
    recompute: bool | float = False, loss_parallel: bool = False, sequence_parallel: bool = False,
    reshard_after_forward: bool | None = None, cp_comm_type: str = "p2p", selective: bool = False,
) -> CommVolumes:
    """Bytes one GPU sends per step under `degrees` (see the module docstring).

    `recompute`: the fraction of layers under full activation checkpointing (True: all).
    `loss_parallel`: the head's logits stay split over the vocabulary (no gather).
    `sequence_parallel`: changes what a recomputed layer repeats and all-reduces the gradients
    of the vectors TP keeps whole.
    `reshard_after_forward`: the runtime's key resolved (None: the strategy's default); groups
    that reshard after forward are gathered again in backward.
    `cp_comm_type`: how context-parallel attention exchanges k and v ("p2p", "all_gather",
    "a2a"; meshtrain.plan.context).
    `selective`: the recomputed layers are op-level selective (they keep TP's reduce-scatter
    outputs).
    """
    recompute = float(recompute)
    dense, expert, once = _local_elements(model, degrees)
    c, r = training.compute_bytes, REDUCE_BYTES
    shard, rep = degrees.hybrid_shard_degree, degrees.replicate_degree
    expert_shard = expert_shard_degree(shard, degrees.tensor_parallel_degree,
                                       degrees.expert_parallel_degree)
    reshard = degrees.reshard_after_forward if reshard_after_forward is None \
        else reshard_after_forward
    gathers = 2 if reshard else 1
    all_gather = (all_gather_bytes(shard, (gathers * (dense - once) + once) * c)
                  + all_gather_bytes(expert_shard, gathers * expert * c))
    reduce_scatter = reduce_scatter_bytes(shard, dense * r) + reduce_scatter_bytes(
        expert_shard, expert * r)
    all_reduce = all_reduce_bytes(rep, dense / shard * r) + all_reduce_bytes(
        rep, expert / expert_shard * r)
    return CommVolumes(
        fsdp_all_gather=all_gather,
        fsdp_reduce_scatter=reduce_scatter,
        data_parallel_all_reduce=all_reduce,
        tensor_parallel=_tensor_parallel(model, degrees, training, recompute, loss_parallel,
                                         sequence_parallel, selective),
        expert_all_to_all=_expert_parallel(model, degrees, training, recompute),
        context_parallel=_context_parallel(model, degrees, training, recompute,
                                            cp_comm_type),
    )


def _tokens(degrees: ResolvedDegrees, training: Training) -> int:
    return training.micro_batch * training.seq_len // degrees.context_parallel_degree


def _tensor_parallel(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, recompute: float,
    loss_parallel: bool, sequence_parallel: bool, selective: bool = False,
) -> float:
    t = degrees.tensor_parallel_degree
    if t == 1:
        return 0.0
    message = training.compute_bytes * _tokens(degrees, training) * model.hidden_size
    # What a recomputed layer repeats (see the module docstring): the attention's all-reduce,
    # or with sequence parallelism both all-gathers and (unless kept) the attention's
    # reduce-scatter.
    gathers = 2 if selective else 3
    repeated = gathers * all_gather_bytes(t, message) if sequence_parallel else all_reduce_bytes(
        t, message)
    per_layer = 4 * all_reduce_bytes(t, message) + recompute * repeated
    logits = 0.0 if loss_parallel else all_gather_bytes(
        t, training.compute_bytes * _tokens(degrees, training) * model.vocab_size)
    # The head's input gradient and the vocab-parallel embedding's output: one all-reduce each.
    ends = logits + 2 * all_reduce_bytes(t, message)
    if loss_parallel:
        # torch's vocab-parallel cross entropy all-reduces three fp32 numbers per token (the
        # largest logit, the sum of exponentials, the target's logit) instead of the gather.
        ends += 3 * all_reduce_bytes(t, _F32 * _tokens(degrees, training))
    if sequence_parallel:
        # Norm weights and other vectors TP keeps whole see only their sequence shard: their
        # gradients are partial sums, all-reduced over the TP group.
        vectors = sum(g.numel * g.count for g in param_groups(model)
                      if g.tp_dim is None and not g.expert and len(g.shape) == 1)
        ends += all_reduce_bytes(t, training.compute_bytes * vectors)
    return model.num_layers * per_layer + ends


def _expert_parallel(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, recompute: float
) -> float:
    ep = degrees.expert_parallel_degree
    if ep == 1 or not model.is_moe:
        return 0.0
    tp = degrees.tensor_parallel_degree
    # With TP each tp rank dispatches only its share of the (shared) tokens, then the outputs
    # are all-gathered over tp (and the input gradients in backward).
    routed = _tokens(degrees, training) / tp * model.experts_per_token
    message = training.compute_bytes * routed * model.hidden_size
    per_layer = (4 + 2 * recompute) * all_to_all_bytes(ep, message)
    if tp > 1:
        rows = training.compute_bytes * _tokens(degrees, training) * model.hidden_size
        per_layer += (2 + recompute) * all_gather_bytes(tp, rows)
    return model.num_layers * per_layer


def _context_parallel(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, recompute: float,
    comm_type: str,
) -> float:
    layer = context_layer_bytes(model, cp=degrees.context_parallel_degree,
                                tokens=_tokens(degrees, training),
                                compute_bytes=training.compute_bytes,
                                tensor_parallel_degree=degrees.tensor_parallel_degree,
                                comm_type=comm_type)
    return layer.per_step(model.num_layers, recompute)


def group_bandwidth(cluster: Cluster, size: int, stride: int) -> float:
    """Bytes/s per GPU for a ring over `size` ranks `stride` apart.

    Inside a host: the GPU's NVLink/PCIe bandwidth. Across hosts: the host's network shared by
    the ``ranks_per_node / m`` groups that cross it, m = this group's ranks per host.
    """
    if size <= 1 or not (cluster.intra_node_bytes_per_s or cluster.inter_node_bytes_per_s):
        return math.inf  # nothing to send, or no bandwidth known: not timed
    per_node = cluster.ranks_per_node
    if size * stride <= per_node:
        return cluster.intra_node_bytes_per_s or cluster.inter_node_bytes_per_s
    members = max(1, per_node // stride) if stride < per_node else 1
    network = cluster.inter_node_bytes_per_s * members / per_node
    intra = cluster.intra_node_bytes_per_s
    return min(intra, network) if intra else network


@dataclass(frozen=True)
class StepTime:
    """A rough step time: compute overlapped with FSDP/DP traffic, TP/EP/CP (and pipeline
    p2p) exposed; with pipelining the busy time is `1 - bubble_fraction` of the step."""

    compute_s: float
    overlapped_comm_s: float
    exposed_comm_s: float
    tokens_per_step: int
    bubble_fraction: float = 0.0

    @property
    def busy_s(self) -> float:
        """The step without the pipeline's idle time."""
        return max(self.compute_s, self.overlapped_comm_s) + self.exposed_comm_s

    @property
    def step_s(self) -> float:
        return self.busy_s / (1.0 - self.bubble_fraction)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.step_s > 0 else 0.0


def training_flops_per_gpu(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, *, recompute_fraction: float
) -> float:
    """6 N_active FLOPs per token (+2 N for recomputed layers) plus attention's 12 L s h_attn.

    N_active leaves out the input embedding and the experts a token does not visit.
    Encoder-decoder models: meshtrain.plan.encdec.encdec_flops (each stack its own tokens).
    """
    if model.is_encoder_decoder:
        return encdec_flops(model, training, _tokens(degrees, training),
                        training.micro_batch * decoder_seq_len(model, training),
                        recompute_fraction)
    n = model.num_params
    groups = [] if model.declared_num_params else param_groups(model)
    embedding = sum(g.numel * g.count for g in groups if g.unit == "embedding")
    experts = sum(g.numel * g.count for g in groups if g.expert)
    skipped = experts * (1 - model.experts_per_token / model.num_experts) if experts else 0
    active = n - embedding - skipped
    tokens = _tokens(degrees, training)
    attention = 12 * model.num_layers * training.seq_len * model.num_attention_heads \
        * model.attention_head_dim
    per_token = (6 + 2 * recompute_fraction) * active + attention
    return per_token * tokens / degrees.tensor_parallel_degree


def step_time(
    volumes: CommVolumes, flops: float, degrees: ResolvedDegrees, cluster: Cluster,
    training: Training, *, bubble_fraction: float = 0.0,
) -> StepTime:
    """Times from `volumes` and `flops` on `cluster`'s nominal speeds; a pipeline's p2p sends
    go between ranks ``world / pp`` apart."""
    t, s, ep, cp = (degrees.tensor_parallel_degree, degrees.hybrid_shard_degree,
                    degrees.expert_parallel_degree, degrees.context_parallel_degree)
    shard_bw = group_bandwidth(cluster, s, t)
    overlapped = (volumes.fsdp_all_gather + volumes.fsdp_reduce_scatter) / shard_bw \
        + volumes.data_parallel_all_reduce / group_bandwidth(cluster, degrees.replicate_degree,
                                                             s * t)
    exposed = (volumes.tensor_parallel / group_bandwidth(cluster, t, 1)
               + volumes.expert_all_to_all / group_bandwidth(cluster, ep, t)
               + volumes.context_parallel / group_bandwidth(cluster, cp, t))
    pp = degrees.pipeline_parallel_degree
    if volumes.pipeline_p2p:
        exposed += volumes.pipeline_p2p / group_bandwidth(cluster, pp, degrees.world_size // pp)
    compute = flops / (cluster.peak_flops * training.compute_efficiency) \
        if cluster.peak_flops else 0.0
    tokens = degrees.dp_size * training.micro_batch * training.seq_len
    return StepTime(compute, overlapped, exposed, tokens, bubble_fraction)


__all__ = [
    "CommVolumes",
    "StepTime",
    "all_gather_bytes",
    "all_reduce_bytes",
    "all_to_all_bytes",
    "communication_volumes",
    "group_bandwidth",
    "reduce_scatter_bytes",
    "step_time",
    "training_flops_per_gpu",
]
