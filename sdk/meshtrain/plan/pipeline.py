"""Pipeline-parallel terms of the planner: stage sizes, in-flight microbatches, bubble, p2p.

A pipeline of ``p`` ranks runs ``p x v`` stages (``v`` = ``pipeline_stages_per_rank``) over
``m`` microbatches of ``micro_batch / m`` rows each. What one rank holds and waits for depends
on torch.distributed.pipelining's schedule (torch 2.13, schedules.py); counted here in
*chunk-microbatches*: one microbatch's saved activations of one of the rank's stages.

- ``GPipe``: every forward before any backward: all ``m`` microbatches in flight.
- ``1F1B``: rank ``r`` runs ``p - 1 - r`` warm-up forwards, then one forward before each
  backward: ``min(m, p - r)`` in flight, ``p`` on the first rank.
- ``Interleaved1F1B``: torch's ``_get_warmup_ops``: ``(v - 1) x mpr + 2 (p - 1 - r)`` warm-up
  forwards (``mpr = m / max(1, m // p)`` microbatches per round), capped at ``m x v``, plus the
  steady state's one forward before a backward.
- ``ZBVZeroBubble`` (2 stages per rank in a V): rank ``r`` runs ``2 (p - r) - 1`` forwards of
  its first chunk, then ``r`` pairs, then one forward of the second chunk before the first
  input-gradient: ``2 p`` chunk-microbatches of ``L / 2p`` blocks on every rank, as much as
  1F1B's first rank (the ZB-V paper's claim). What the split backward keeps between a chunk's
  input-gradient and weight-gradient steps is not counted.
- ``InterleavedZeroBubble`` warms up as ``Interleaved1F1B`` (torch's same ``_get_warmup_ops``);
  ``LoopedBFS`` runs every forward of every local stage first: ``m x v`` in flight.

Bubble (idle) fraction of a step: ``(p - 1) / (m + p - 1)`` for GPipe and 1F1B,
``(p - 1) / (v m + p - 1)`` interleaved (LoopedBFS: the same, an estimate). Zero-bubble (an
estimate, not a measurement): with forward, input-gradient and weight-gradient of a chunk
taking equal time, ZB-V's schedule leaves about one such unit per hop idle (ZB-H1's
residual ``T_F + T_B - T_W``) out of ``3 v m`` units of work:
``(p - 1) / (3 v m + p - 1)`` (InterleavedZeroBubble: the same).

Point-to-point bytes per step and stage boundary: the activations forward and their gradients
backward, ``2 x m x (micro_batch / m) x seq x hidden x dtype bytes``; a rank sends one
direction of each of its stages' boundaries: ``v x (micro_batch x seq x hidden x dtype)`` each
way at most (an interior rank).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from meshtrain.contract.errors import ConfigError

PLANNED_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble")
"""The schedules the planner's candidates use (every schedule the contract accepts is
estimated)."""


@dataclass(frozen=True)
class PipelineEstimate:
    """The pipeline terms of one layout (per rank of the peak stage)."""

    degree: int
    schedule: str
    microbatches: int
    stages_per_rank: int
    rows_per_microbatch: int
    blocks_per_stage: int
    """The most blocks one stage holds (a rank holds `stages_per_rank` of them)."""
    in_flight_first: int
    """Chunk-microbatches whose activations the first rank holds at its peak."""
    in_flight_last: int
    """The same on the last rank (which also holds the head and the loss)."""
    bubble_fraction: float
    p2p_bytes_per_boundary: float
    """Bytes through one stage boundary per step, both directions."""
    p2p_bytes_per_rank: float
    """Bytes one (interior) rank sends per step."""
    peak_stage: str = "first"
    """Which end of the pipeline has the larger peak: "first" or "last"."""


def in_flight(schedule: str, pp: int, microbatches: int, stages_per_rank: int,
              rank: int) -> int:
    """Chunk-microbatches rank `rank` of `pp` holds at once (module docstring)."""
    m, v = microbatches, stages_per_rank
    if schedule == "GPipe":
        return m
    if schedule == "LoopedBFS":
        return m * v
    if schedule == "1F1B":
        return min(m, pp - rank)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        per_round = m // max(1, m // pp)
        warmup = (v - 1) * per_round + 2 * (pp - 1 - rank)
        return min(warmup + 1, m * v)
    if schedule == "ZBVZeroBubble":
        return min(2 * pp, 2 * m)
    raise ConfigError(f"pipeline_schedule={schedule!r} is not a schedule the planner knows.")


def bubble_fraction(schedule: str, pp: int, microbatches: int, stages_per_rank: int) -> float:
    """The idle fraction of a step (module docstring); 0 without pipelining."""
    if pp == 1:
        return 0.0
    m, v = microbatches, stages_per_rank
    if schedule in ("GPipe", "1F1B"):
        return (pp - 1) / (m + pp - 1)
    if schedule in ("Interleaved1F1B", "LoopedBFS"):
        return (pp - 1) / (v * m + pp - 1)
    if schedule in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        return (pp - 1) / (3 * v * m + pp - 1)
    raise ConfigError(f"pipeline_schedule={schedule!r} is not a schedule the planner knows.")


def p2p_bytes_per_boundary(microbatches: int, rows: int, seq: int, hidden: int,
                           dtype_bytes: int) -> float:
    """Activations forward + gradients backward through one boundary per step."""
    return 2.0 * microbatches * rows * seq * hidden * dtype_bytes


def stage_blocks(num_blocks: int, stages: int, split_points: list[int] | None) -> int:
    """The most blocks one stage holds: by `split_points`, else an even split (ceil)."""
    if stages > num_blocks:
        raise ConfigError(f"{stages} pipeline stages need at least {stages} blocks, but the "
                          f"model has {num_blocks}. Use fewer stages (pipeline_parallel_degree "
                          "x pipeline_stages_per_rank).")
    if split_points is None:
        return math.ceil(num_blocks / stages)
    edges = [0, *split_points, num_blocks]
    if edges[-2] >= num_blocks:
        raise ConfigError(f"pipeline_split_points={split_points}: the last stage would be "
                          f"empty (the model has {num_blocks} blocks).")
    return max(b - a for a, b in itertools.pairwise(edges))


def rows_per_microbatch(micro_batch: int, microbatches: int) -> int:
    """Rows of one microbatch; the runtime refuses rows that do not split evenly."""
    if micro_batch % microbatches:
        raise ConfigError(
            f"micro_batch={micro_batch} rows per data-parallel rank do not split into "
            f"microbatches={microbatches} equal chunks (forward_backward refuses them). Give the "
            f"rows each data-parallel rank trains on per step as a multiple of {microbatches} "
            "(--micro-batch; the Estimator's plan_options={'micro_batch': N}), or fewer "
            "microbatches.")
    return micro_batch // microbatches


__all__ = ["PLANNED_SCHEDULES", "PipelineEstimate", "bubble_fraction", "in_flight",
           "p2p_bytes_per_boundary", "rows_per_microbatch", "stage_blocks"]
