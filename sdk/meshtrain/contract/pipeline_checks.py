"""The pipeline-parallel parameters' rules, checked on the client before anything launches.

The schedule rules are torch.distributed.pipelining's own (torch 2.13, schedules.py), quoted
here so a job that torch would refuse on every rank minutes later is refused up front:

- ``Schedule1F1B``: "Number of microbatches must be greater than or equal to the number of
  stages";
- ``ScheduleInterleaved1F1B`` / ``ScheduleInterleavedZeroBubble``: the microbatches must be a
  multiple of the number of rounds, ``max(1, microbatches // pp)``;
- ``ScheduleZBVZeroBubble``: "ZBV requires exactly 2 stages per rank" (in a V);
- the zero-bubble schedules refuse compiled stages (they split backward into input and weight
  parts, which torch.compile does not support).

Nothing here imports torch or pydantic models: `check_pipeline` reads attributes only.
"""

from __future__ import annotations

from typing import Any

SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
"""Schedules that run one stage per rank (torch's PipelineScheduleSingle)."""
ZERO_BUBBLE_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble")
ROUND_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble")


def default_microbatches(raw: dict[str, Any]) -> int | None:
    """The microbatches an unset key means, from the raw parameters: the number of stages
    (``pipeline_parallel_degree x stages_per_rank``), the fewest that keep every stage busy and
    that every schedule accepts (1F1B: at least one per stage; the interleaved ones: a multiple
    of their rounds); 1 without pipelining. None when the values are not valid yet (their own
    checks then report them)."""
    pp = raw.get("pipeline_parallel_degree", 1)
    schedule = raw.get("pipeline_schedule", "1F1B")
    per_rank = raw.get("pipeline_stages_per_rank")
    if not _is_count(pp) or not isinstance(schedule, str):
        return None
    if per_rank is None:
        per_rank = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
    if not _is_count(per_rank):
        return None
    return pp * per_rank if pp > 1 else 1


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_pipeline(params: Any) -> None:
    """Raise ValueError (the contract turns it into a ConfigError) for pipeline parameters
    that torch's schedules, or this build, cannot run."""
    pp, schedule = params.pipeline_parallel_degree, params.pipeline_schedule
    if pp == 1:
        if params.pipeline_split_points is not None or params.pipeline_stages_per_rank:
            raise ValueError(
                "pipeline_split_points / pipeline_stages_per_rank need pipelining, but "
                "pipeline_parallel_degree=1. Set pipeline_parallel_degree >= 2 or drop them.")
        return
    per_rank = params.stages_per_rank
    _check_stages_per_rank(schedule, per_rank)
    _check_microbatches(schedule, params.microbatches, pp, pp * per_rank)
    _check_split_points(params.pipeline_split_points, pp * per_rank, pp, per_rank)
    _check_combinations(params, pp, schedule)


def _check_stages_per_rank(schedule: str, per_rank: int) -> None:
    if schedule in SINGLE_STAGE_SCHEDULES and per_rank != 1:
        raise ValueError(
            f"pipeline_schedule={schedule!r} runs one stage per rank, but "
            f"pipeline_stages_per_rank={per_rank}. Use 'Interleaved1F1B' (or 'LoopedBFS', "
            "'InterleavedZeroBubble', 'ZBVZeroBubble') for several stages per rank, or 1.")
    if schedule == "ZBVZeroBubble" and per_rank != 2:
        raise ValueError(
            f"pipeline_schedule='ZBVZeroBubble' with pipeline_stages_per_rank={per_rank}: torch "
            "says \"ZBV requires exactly 2 stages per rank\" (stages in a V). Use 2.")
    if schedule not in SINGLE_STAGE_SCHEDULES and per_rank < 2:
        raise ValueError(
            f"pipeline_schedule={schedule!r} interleaves several stages per rank, but "
            f"pipeline_stages_per_rank={per_rank}. Use 2 or more, or pipeline_schedule='1F1B'.")


def _check_microbatches(schedule: str, microbatches: int, pp: int, stages: int) -> None:
    if schedule == "1F1B" and microbatches < stages:
        raise ValueError(
            f"pipeline_schedule='1F1B' with microbatches={microbatches} and {stages} stages: "
            "torch says \"Number of microbatches must be greater than or equal to the number "
            f"of stages\". Use microbatches >= {stages}, or leave it unset (the default is the "
            "number of stages).")
    if schedule in ROUND_SCHEDULES:
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            raise ValueError(
                f"pipeline_schedule={schedule!r} with microbatches={microbatches} at "
                f"pipeline_parallel_degree={pp}: torch requires the microbatches to be a "
                f"multiple of the number of rounds max(1, {microbatches} // {pp}) = {rounds}. "
                f"Use a multiple of {pp} (e.g. {pp * max(1, microbatches // pp)}), or at most "
                f"{2 * pp - 1}.")


def _check_split_points(points: list[int] | None, stages: int, pp: int, per_rank: int) -> None:
    if points is None:
        return
    if len(points) != stages - 1:
        raise ValueError(
            f"pipeline_split_points={points} gives {len(points) + 1} stages, but "
            f"pipeline_parallel_degree={pp} x pipeline_stages_per_rank={per_rank} = {stages} "
            f"stages. Give {stages - 1} increasing block indices.")
    if any(b <= a for a, b in zip([0, *points], points, strict=False)):
        raise ValueError(
            f"pipeline_split_points={points} must be strictly increasing block indices above 0 "
            "(each is the first block of the next stage), so that no stage is empty.")


def _check_combinations(params: Any, pp: int, schedule: str) -> None:
    for key in ("sequence_parallel", "loss_parallel"):
        if getattr(params, key):
            raise ValueError(
                f"{key}=True with pipeline_parallel_degree={pp}: stages send plain activations "
                "between ranks, and this build does not yet carry the sequence- or "
                "vocabulary-sharded tensors these modes leave at a stage boundary. Use tensor "
                f"parallelism without {key}, or pipeline_parallel_degree=1.")
    if params.activation_offloading:
        raise ValueError(
            f"activation_offloading=True with pipeline_parallel_degree={pp}: the offloader "
            "starts its prefetch at the end of the whole model's forward, which no pipeline "
            "stage runs. Use activation_checkpointing alone, or pipeline_parallel_degree=1.")
    if params.compile and schedule in ZERO_BUBBLE_SCHEDULES:
        raise ValueError(
            f"compile=True with pipeline_schedule={schedule!r}: torch's zero-bubble schedules "
            "split backward into input and weight parts, which torch.compile does not support "
            "(torch refuses compiled stages there). Use '1F1B' or 'Interleaved1F1B', or "
            "compile=False.")
