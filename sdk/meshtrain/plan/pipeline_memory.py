"""Per-rank memory of a pipeline-parallel layout: the peak of its first and last rank.

A rank of a pipeline holds ``v`` stages of ``b`` blocks (``b`` the largest stage of the split,
``v`` = ``pipeline_stages_per_rank``), sharded by its own stage's group exactly as a model of
``v x b`` blocks would be (meshtrain.plan.phases), and the saved activations of the schedule's
in-flight chunk-microbatches (meshtrain.plan.pipeline) of ``micro_batch / m`` rows each.

- The first rank holds the input embedding, no head and no loss: its loss phase is its
  states and saved activations only, and the head's states are taken off. Its in-flight
  count is the schedule's largest.
- The last rank holds the head and the final norm (the embedding's states taken off) and the
  loss of one microbatch at a time; its in-flight microbatches keep their logits' saved terms
  (GPipe: all ``m``).
- ZBVZeroBubble places the first and the last stage on the same rank (the V): that rank holds
  both ends and ``2 p`` chunk-microbatches.
- A tied embedding/head lives on both end ranks (the runtime keeps the copies in sync), so
  nothing is taken off.

The peak rank is the one with the larger peak phase: that is the figure a layout is judged by.
Buffers that scale with the gathered model (FSDP's flat all-gather buffers of the root) are the
stage model's, both ends included: a slight overestimate. Not calibrated against the runtime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.distribution import SMPParameters
from meshtrain.contract.errors import ConfigError
from meshtrain.plan.activations import ActivationEstimate
from meshtrain.plan.memory import (
    MemoryEstimate,
    ModelStateBytes,
    Training,
    group_shard_elements,
)
from meshtrain.plan.models import ModelSpec, param_groups
from meshtrain.plan.phases import _BEFORE_BLOCKS, RESIDENT_TERMS, PhaseMemory
from meshtrain.plan.pipeline import (
    PipelineEstimate,
    bubble_fraction,
    in_flight,
    p2p_bytes_per_boundary,
    rows_per_microbatch,
    stage_blocks,
)

ActivationsOf = Callable[[ModelSpec, Training], ActivationEstimate]
"""(a model of one stage's blocks, one microbatch's training) -> its saved activations."""
MemoryOf = Callable[[ModelSpec, Training, ActivationEstimate], MemoryEstimate]
"""(a model of one rank's blocks, one microbatch's training, activations) -> its memory."""


@dataclass(frozen=True)
class StageView:
    """The peak rank of a pipeline: what it holds and the pipeline's terms."""

    rank_model: ModelSpec
    """The model cut to the blocks one rank holds (both ends: see the module docstring)."""
    training: Training
    """`training` with one microbatch's rows."""
    memory: MemoryEstimate
    activations: ActivationEstimate
    pipeline: PipelineEstimate


def check_pipelinable(model: ModelSpec) -> None:
    """The runtime splits decoder-only models by their blocks; the planner needs their shape."""
    if model.is_encoder_decoder:
        raise ConfigError(f"{model.name}: pipeline parallelism splits decoder-only models by "
                          "their blocks; an encoder-decoder is not split. Use "
                          "pipeline_parallel_degree=1.")
    if model.declared_num_params is not None:
        raise ConfigError(f"{model.name}: a model given only by its parameter count has no "
                          "blocks to split into pipeline stages. Give its shape (--model or "
                          "--hidden-size/--num-layers/...).")


def pipeline_stage(model: ModelSpec, parameters: SMPParameters, degrees: ResolvedDegrees,
                   training: Training, *, activations_of: ActivationsOf,
                   memory_of: MemoryOf, on_gpu: bool = True) -> StageView:
    """The peak rank's memory and the pipeline's terms for a layout with pp > 1."""
    check_pipelinable(model)
    pp, m = degrees.pipeline_parallel_degree, parameters.microbatches
    v, schedule = parameters.stages_per_rank, parameters.pipeline_schedule
    rows = rows_per_microbatch(training.micro_batch, m)
    blocks = stage_blocks(model.num_blocks, pp * v, parameters.pipeline_split_points)
    chunk = model.model_copy(update={"num_layers": blocks})
    rank_model = model.model_copy(update={"num_layers": blocks * v})
    one = dataclasses.replace(training, micro_batch=rows)
    per_microbatch = activations_of(chunk, one)
    first_k, last_k = in_flight(schedule, pp, m, v, 0), in_flight(schedule, pp, m, v, pp - 1)
    if schedule == "ZBVZeroBubble":  # rank 0 holds stage 0 and stage 2p - 1
        acts = _in_flight(per_microbatch, first_k, with_loss=True)
        views = {"first": (acts, memory_of(rank_model, one, acts))}
    else:
        first = _in_flight(per_microbatch, first_k, with_loss=False)
        last = _in_flight(per_microbatch, last_k, with_loss=True)
        views = {
            "first": (first, _without_end(memory_of(rank_model, one, first),
                                          _end_fraction(rank_model, degrees, "head"),
                                          first_rank=True, on_gpu=on_gpu)),
            "last": (last, _without_end(memory_of(rank_model, one, last),
                                        _end_fraction(rank_model, degrees, "embedding"),
                                        first_rank=False, on_gpu=on_gpu)),
        }
    peak = max(views, key=lambda name: views[name][1].peak_bytes)
    acts, memory = views[peak]
    boundary = p2p_bytes_per_boundary(m, rows, training.seq_len // degrees.context_parallel_degree,
                                      model.hidden_size, training.compute_bytes)
    terms = PipelineEstimate(
        degree=pp, schedule=schedule, microbatches=m, stages_per_rank=v,
        rows_per_microbatch=rows, blocks_per_stage=blocks, in_flight_first=first_k,
        in_flight_last=last_k, bubble_fraction=bubble_fraction(schedule, pp, m, v),
        p2p_bytes_per_boundary=boundary, p2p_bytes_per_rank=v * boundary, peak_stage=peak)
    return StageView(rank_model, one, memory, acts, terms)


def _in_flight(per_microbatch: ActivationEstimate, count: int, *,
               with_loss: bool) -> ActivationEstimate:
    """`count` chunk-microbatches' saved activations (blocks and, at the last rank, the
    logits' terms; the first rank keeps only what exists before its blocks run)."""
    terms = {name: count * value for name, value in per_microbatch.model_terms.items()
             if with_loss or name in _BEFORE_BLOCKS}
    return dataclasses.replace(
        per_microbatch, num_layers=count * per_microbatch.num_layers,
        num_checkpointed=count * per_microbatch.num_checkpointed,
        num_checkpoints_on_gpu=count * per_microbatch.num_checkpoints_on_gpu,
        model_terms=terms)


def _end_fraction(rank_model: ModelSpec, degrees: ResolvedDegrees, unit: str) -> float:
    """The share of this rank's sharded elements that the other end's `unit` holds (0 for a
    tied embedding: both ends keep a copy)."""
    if rank_model.tie_word_embeddings:
        return 0.0
    tp, ep, shard = (degrees.tensor_parallel_degree, degrees.expert_parallel_degree,
                     degrees.hybrid_shard_degree)
    sizes = {True: 0, False: 0}
    for group in param_groups(rank_model):
        sizes[group.unit == unit] += group.count * group_shard_elements(group, tp=tp, ep=ep,
                                                                        shard=shard)
    return sizes[True] / (sizes[True] + sizes[False])


def _without_end(memory: MemoryEstimate, fraction: float, *, first_rank: bool,
                 on_gpu: bool) -> MemoryEstimate:
    """`memory` without the states of the end this rank does not hold (and, on the first rank,
    without the loss's buffers and the head's gradient)."""
    keep = 1.0 - fraction
    scaled = {"sharded_parameters", "optimizer_states"} | ({"optimizer_step_buffer"}
                                                           if on_gpu else set())
    phases = []
    for phase in memory.phases:
        if first_rank and phase.name == "loss":
            # No loss here: while the last rank computes it, this rank holds its states and
            # saved activations only.
            forward = memory.phases[0].terms
            phase = PhaseMemory("loss", {k: v for k, v in forward.items()
                                         if k in RESIDENT_TERMS})
        terms = {}
        for key, value in phase.terms.items():
            if key in scaled or (key == "sharded_gradients" and phase.name == "optimizer_step"):
                value *= keep
            elif key == "sharded_gradients" and first_rank:
                value = 0.0  # the head's gradient shard: the head is on the last rank
            terms[key] = value
        phases.append(PhaseMemory(phase.name, terms))
    peak = max(phases, key=lambda phase: phase.total)
    states = memory.states
    return MemoryEstimate(
        states=ModelStateBytes(round(states.parameters * keep), round(states.gradients * keep),
                               round(states.optimizer_states * keep)),
        activations=memory.activations,
        temporary={k: v for k, v in peak.terms.items() if k not in RESIDENT_TERMS},
        optimizer_step=round(phases[-1].terms.get("optimizer_step_buffer", 0.0)),
        reserve=memory.reserve, phases=tuple(phases))


__all__ = ["StageView", "check_pipelinable", "pipeline_stage"]
