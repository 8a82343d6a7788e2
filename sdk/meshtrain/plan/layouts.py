"""Candidate layouts for a cluster, their estimates, and a ranked recommendation.

Every candidate is a set of SMP parameters that meshtrain's own `resolve_degrees` accepts for
the cluster's world size, so the planner never recommends a layout the runtime would reject.
Candidates: tensor parallelism within a host (dividing the attention and key/value heads);
every hybrid_shard_degree dividing the data-parallel size, with FSDP's default strategy and
with shard_grad_op (without sharding: no_shard keeping its gathered parameters between forward
and backward, and resharding them after forward); expert parallelism dividing the shard degree
(shard x tp with TP: the EP group is folded over both) and the experts (MoE only); activation
checkpointing off, on, on with offloading, and op-level selective ("selective": decoder-only
models); sequence parallelism off and on with TP;
every context_parallel_degree dividing the shard degree (decoder-only models, without
pipelining or expert parallelism, which the contract refuses with it; the sequence must split
into 2 x cp chunks; `cp_comm_type` given, meshtrain.plan.context); and each of these within one
stage's ranks for every pipeline-parallel degree dividing the world and the blocks
(`PipelineOptions`: the schedule and microbatches; meshtrain.plan.pipeline).

Ranking: layouts that fit first, by estimated tokens per second (the cluster's nominal FLOP/s
and bandwidths; see `comm.step_time`), then without recomputation before with it, then by peak
memory; then the layouts that do not fit, closest to fitting first.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from meshtrain.contract._messages import divisors, hosts_and_processes
from meshtrain.contract.degrees import ResolvedDegrees, resolve_degrees
from meshtrain.contract.distribution import SMPParameters
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.pipeline_checks import SINGLE_STAGE_SCHEDULES
from meshtrain.plan.activations import RECOMPUTE_FOR_POLICY, ActivationEstimate, activation_bytes
from meshtrain.plan.cluster import GIB, Cluster
from meshtrain.plan.comm import (
    CommVolumes,
    StepTime,
    communication_volumes,
    step_time,
    training_flops_per_gpu,
)
from meshtrain.plan.context import check_context_layout, max_seq_len
from meshtrain.plan.memory import (
    MemoryEstimate,
    ModelStateBytes,
    Training,
    model_state_bytes,
    zero_stage_bytes,
)
from meshtrain.plan.models import ModelSpec
from meshtrain.plan.phases import RESIDENT_TERMS, Offload, PhaseMemory, phase_memory
from meshtrain.plan.pipeline import PipelineEstimate
from meshtrain.plan.pipeline_memory import pipeline_stage

LAYOUT_KEYS = ("hybrid_shard_degree", "tensor_parallel_degree", "expert_parallel_degree",
               "context_parallel_degree", "sharding_strategy", "sequence_parallel",
               "activation_checkpointing", "activation_checkpointing_interval",
               "activation_offloading", "activation_loading_horizon", "cpu_offload",
               "reshard_after_forward", "pipeline_parallel_degree", "microbatches",
               "pipeline_schedule", "pipeline_stages_per_rank", "cp_comm_type")
Reshard = bool | None
"""A `reshard_after_forward` choice for the candidates: True / False, or None (each
candidate its strategy's default, and a no_shard candidate both ways)."""


def resolve_reshard(parameters: SMPParameters, degrees: ResolvedDegrees) -> bool:
    """The runtime's `reshard_after_forward`: as given, or "auto" the strategy's default
    (False for no_shard, shard_grad_op, _hybrid_shard_zero2)."""
    setting = parameters.reshard_after_forward
    return degrees.reshard_after_forward if setting == "auto" else bool(setting)


@dataclass(frozen=True)
class LayoutEstimate:
    """One layout on one cluster: memory, communication, time, and whether it fits."""

    parameters: SMPParameters
    degrees: ResolvedDegrees
    memory: MemoryEstimate
    activations: ActivationEstimate
    comm: CommVolumes
    time: StepTime
    capacity_bytes: int | None
    pipeline: PipelineEstimate | None = None
    """The pipeline's terms (None without pipelining)."""

    @property
    def fits(self) -> bool | None:
        """Peak memory within the GPU minus the reserve (None: no GPU memory to compare)."""
        if self.capacity_bytes is None:
            return None
        return self.memory.peak_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> float | None:
        if self.capacity_bytes is None:
            return None
        return self.capacity_bytes - self.memory.peak_bytes

    @property
    def reshard_after_forward(self) -> bool:
        """Whether FSDP groups free their unsharded parameters after forward (resolved)."""
        return resolve_reshard(self.parameters, self.degrees)

    @property
    def layout(self) -> dict[str, Any]:
        """The SMP parameters of this layout (only keys that differ from the defaults)."""
        values = self.parameters.model_dump()
        defaults = SMPParameters().model_dump()
        shown = {"hybrid_shard_degree"} | ({"microbatches", "pipeline_schedule"}
                                           if self.pipeline is not None else set()) | (
            {"cp_comm_type"} if self.degrees.context_parallel_degree > 1 else set())
        return {key: values[key] for key in LAYOUT_KEYS
                if key in shown or (values[key] != defaults[key] and key != "cp_comm_type")}

    def describe(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.layout.items())


def estimate_layout(
    model: ModelSpec, parameters: SMPParameters, cluster: Cluster, training: Training,
) -> LayoutEstimate:
    """Estimate one layout; raises ConfigError when the runtime would reject it. With
    pipelining, the memory is the peak rank's (meshtrain.plan.pipeline_memory)."""
    degrees = resolve_degrees(parameters, cluster.world_size, ranks_per_host=cluster.ranks_per_node,
                              world_description=_world(cluster))
    training = _with_precision(training, parameters)
    check_context_layout(model, seq_len=training.seq_len, cp=degrees.context_parallel_degree,
                         tensor_parallel_degree=degrees.tensor_parallel_degree,
                         comm_type=parameters.cp_comm_type)
    if degrees.pipeline_parallel_degree > 1:
        return _estimate_pipeline(model, parameters, degrees, cluster, training)
    acts = _activations(model, parameters, degrees, training)
    memory = _memory(model, parameters, degrees, training, acts, cluster)
    recompute_fraction = (acts.num_checkpointed + acts.encoder_checkpointed) / model.num_blocks
    selective = parameters.checkpointing_policy == "selective"
    volumes = communication_volumes(
        model, degrees, training, recompute=recompute_fraction,
        sequence_parallel=parameters.sequence_parallel and degrees.tensor_parallel_degree > 1,
        reshard_after_forward=resolve_reshard(parameters, degrees),
        cp_comm_type=parameters.cp_comm_type, selective=selective,
    )
    # a selective layer's recompute runs no matmul: its (elementwise) FLOPs are not counted
    flops = training_flops_per_gpu(model, degrees, training,
                                   recompute_fraction=0.0 if selective else recompute_fraction)
    return LayoutEstimate(parameters, degrees, memory, acts, volumes,
                          step_time(volumes, flops, degrees, cluster, training),
                          cluster.capacity_bytes)


def _activations(model: ModelSpec, parameters: SMPParameters, degrees: ResolvedDegrees,
                 training: Training) -> ActivationEstimate:
    return activation_bytes(
        model, seq_len=training.seq_len, micro_batch=training.micro_batch,
        precision=training.precision, tensor_parallel_degree=degrees.tensor_parallel_degree,
        sequence_parallel=parameters.sequence_parallel and degrees.tensor_parallel_degree > 1,
        context_parallel_degree=degrees.context_parallel_degree,
        recompute=RECOMPUTE_FOR_POLICY[parameters.checkpointing_policy],
        checkpoint_interval=parameters.activation_checkpointing_interval,
        offload=parameters.activation_offloading,
        loading_horizon=parameters.activation_loading_horizon,
        decoder_seq_len=training.decoder_seq_len,
    )


def _estimate_pipeline(model: ModelSpec, parameters: SMPParameters, degrees: ResolvedDegrees,
                       cluster: Cluster, training: Training) -> LayoutEstimate:
    """The peak rank's memory; FSDP/TP traffic of the rank's blocks for all its rows (FSDP
    gathers counted once per step), the p2p sends exposed, the bubble idle."""
    view = pipeline_stage(
        model, parameters, degrees, training,
        activations_of=lambda chunk, one: _activations(chunk, parameters, degrees, one),
        memory_of=lambda rank_model, one, acts: _memory(rank_model, parameters, degrees, one,
                                                         acts, cluster),
        on_gpu=cluster.rank_unit == "GPU")
    acts, terms = view.activations, view.pipeline
    recompute_fraction = acts.num_checkpointed / max(1, acts.num_layers)
    selective = parameters.checkpointing_policy == "selective"
    volumes = communication_volumes(
        view.rank_model, degrees, training, recompute=recompute_fraction,
        reshard_after_forward=resolve_reshard(parameters, degrees),
        cp_comm_type=parameters.cp_comm_type, selective=selective)
    volumes = dataclasses.replace(volumes, pipeline_p2p=terms.p2p_bytes_per_rank)
    flops = training_flops_per_gpu(
        model, degrees, training,
        recompute_fraction=0.0 if selective else recompute_fraction) / terms.degree
    time = step_time(volumes, flops, degrees, cluster, training,
                     bubble_fraction=terms.bubble_fraction)
    return LayoutEstimate(parameters, degrees, view.memory, acts, volumes, time,
                          cluster.capacity_bytes, terms)


def _memory(model: ModelSpec, parameters: SMPParameters, degrees: ResolvedDegrees,
            training: Training, acts: ActivationEstimate, cluster: Cluster) -> MemoryEstimate:
    offload: Offload = "cpu_offload" if parameters.cpu_offload else (
        "optimizer" if training.optimizer_offload else "none")
    # The runtime skips FSDP only for one data-parallel rank under tensor or pipeline
    # parallelism without an FSDP policy (meshtrain_runtime.parallelize.uses_fsdp).
    split = degrees.tensor_parallel_degree > 1 or degrees.pipeline_parallel_degree > 1
    uses_fsdp = (not split or degrees.data_parallel_degree > 1
                 or training.mixed or parameters.cpu_offload)
    phases = phase_memory(model, degrees, training, acts, offload=offload, uses_fsdp=uses_fsdp,
                          loss_parallel=parameters.loss_parallel,
                          on_gpu=cluster.rank_unit == "GPU",
                          reshard_after_forward=resolve_reshard(parameters, degrees))
    states = model_state_bytes(model, degrees, training, cpu_offload=parameters.cpu_offload)
    if offload == "optimizer":
        states = ModelStateBytes(states.parameters, states.gradients, 0)
    peak = max(phases, key=lambda phase: phase.total)
    temporary = {k: v for k, v in peak.terms.items() if k not in RESIDENT_TERMS}
    step_buffer = phases[-1].terms["optimizer_step_buffer"]
    return MemoryEstimate(states=states, activations=acts.total_bytes, temporary=temporary,
                          optimizer_step=step_buffer, reserve=cluster.reserve_bytes,
                          phases=tuple(phases))


def _with_precision(training: Training, parameters: SMPParameters) -> Training:
    """The distribution's mixed_precision, when set, is what the runtime will use."""
    if parameters.mixed_precision is None or parameters.mixed_precision == training.precision:
        return training
    return dataclasses.replace(training, precision=parameters.mixed_precision)


def _world(cluster: Cluster) -> str:
    return hosts_and_processes(cluster.num_nodes, cluster.ranks_per_node)


@dataclass(frozen=True)
class PipelineOptions:
    """The pipeline layouts among the candidates: every pp dividing the world and the blocks
    (x the schedule's stages per rank), with `schedule` over `microbatches` (None: one row per
    microbatch, the training's micro_batch)."""

    microbatches: int | None = None
    schedule: str = "1F1B"


def candidate_parameters(model: ModelSpec, cluster: Cluster, reshard: Reshard = None,
                         pipeline: PipelineOptions | None = None,
                         micro_batch: int = 1, cp_comm_type: str = "p2p",
                         ) -> Iterator[SMPParameters]:
    """Every SMP parameter set the planner considers for `cluster` (see the module docstring);
    `reshard` fixes `reshard_after_forward` for all of them (None: see `Reshard`); `pipeline`
    (default `PipelineOptions()`) and `micro_batch` (rows per data-parallel rank) give the
    pipeline layouts' schedule and microbatches; `cp_comm_type` the context-parallel ones'."""
    pipeline = pipeline or PipelineOptions()
    for pp in _pipeline_degrees(model, cluster.world_size, pipeline.schedule):
        extra: dict[str, Any] = {} if pp == 1 else {
            "pipeline_parallel_degree": pp, "pipeline_schedule": pipeline.schedule,
            "microbatches": pipeline.microbatches or micro_batch}
        extra["cp_comm_type"] = cp_comm_type
        yield from _stage_candidates(model, cluster, cluster.world_size // pp, reshard, extra)


def _pipeline_degrees(model: ModelSpec, world: int, schedule: str) -> list[int]:
    """1, and every pp > 1 dividing `world` whose stages split the blocks evenly."""
    if model.is_encoder_decoder or model.declared_num_params is not None:
        return [1]
    per_rank = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
    return [p for p in divisors(world) if p == 1 or model.num_blocks % (p * per_rank) == 0]


def _stage_candidates(model: ModelSpec, cluster: Cluster, stage_world: int, reshard: Reshard,
                      extra: dict[str, Any]) -> Iterator[SMPParameters]:
    """The candidates within one stage's `stage_world` ranks (`extra`: pipeline keys)."""
    per_node = cluster.ranks_per_node
    tps = [t for t in divisors(stage_world) if t <= per_node
           and model.num_attention_heads % t == 0 and model.num_key_value_heads % t == 0
           and (t == 1 or not model.is_encoder_decoder)]
    recompute_options: tuple[tuple[bool | str, bool], ...] = ((False, False), (True, False),
                                                               (True, True))
    if not model.is_encoder_decoder:  # the planner sizes selective for decoder-only models
        recompute_options += (("selective", False),)
    for tp in tps:
        for shard in divisors(stage_world // tp):
            eps = _expert_degrees(model, shard * tp)  # folded over shard x tp with TP
            sps = [False, True] if tp > 1 else [False]
            cps = [1] if model.is_encoder_decoder else divisors(shard)
            for (strategy, keep), ep, cp, sp, (ac, off) in itertools.product(
                    _fsdp_options(shard, reshard), eps, cps, sps, recompute_options):
                try:
                    yield SMPParameters(
                        hybrid_shard_degree=shard, tensor_parallel_degree=tp,
                        expert_parallel_degree=ep, context_parallel_degree=cp,
                        sharding_strategy=strategy, sequence_parallel=sp,
                        activation_checkpointing=ac, activation_offloading=off,
                        reshard_after_forward=keep, **extra,
                    )
                except ValidationError:
                    continue  # a combination SMPParameters itself rejects


def _fsdp_options(shard: int, reshard: Reshard) -> list[tuple[str | None, bool | str]]:
    """(sharding_strategy, reshard_after_forward) pairs: with a shard group the default
    strategy and shard_grad_op (the same two layouts as reshard True / False); without one
    (no_shard) its default (keep gathered) and resharding after forward."""
    if reshard is not None:
        return [(None, reshard)]
    if shard == 1:
        return [(None, "auto"), (None, True)]
    return [(None, "auto"), ("shard_grad_op", "auto")]


def _expert_degrees(model: ModelSpec, shard: int) -> list[int]:
    if not model.is_moe:
        return [1]
    return [ep for ep in divisors(shard) if model.num_experts % ep == 0]


@dataclass(frozen=True)
class Plan:
    """Ranked layout estimates for one model, cluster and training setup."""

    model: ModelSpec
    cluster: Cluster
    training: Training
    candidates: list[LayoutEstimate]
    model_state_bytes_per_gpu: dict[str, int]
    pipeline: PipelineOptions = PipelineOptions()
    """The schedule and microbatches the pipeline candidates assume."""
    cp_comm_type: str = "p2p"
    """The context-parallel candidates' cp_comm_type."""

    @property
    def best(self) -> LayoutEstimate | None:
        """The top-ranked layout that fits (the first one when fit cannot be judged)."""
        for candidate in self.candidates:
            if candidate.fits is not False:
                return candidate
        return None


def rank_key(estimate: LayoutEstimate) -> tuple:
    """Fitting layouts by speed, then by whether they recompute anything (selective
    checkpointing's recompute of norms and activations costs time the FLOP count does not
    show), then memory; layouts that do not fit by memory (closest first)."""
    if estimate.fits is False:
        return (True, estimate.memory.peak_bytes, -estimate.time.tokens_per_s)
    recomputes = estimate.activations.num_checkpointed + estimate.activations.encoder_checkpointed
    return (False, -estimate.time.tokens_per_s, recomputes > 0, estimate.memory.peak_bytes)


def plan_layouts(model: ModelSpec, cluster: Cluster, training: Training,
                 reshard: Reshard = None, pipeline: PipelineOptions | None = None,
                 cp_comm_type: str = "p2p") -> Plan:
    """Estimate every candidate layout on `cluster` and rank them (`reshard`: see `Reshard`;
    `pipeline`: see `PipelineOptions`; `cp_comm_type`: the context-parallel layouts')."""
    estimates = []
    for parameters in candidate_parameters(model, cluster, reshard, pipeline,
                                           training.micro_batch, cp_comm_type):
        try:
            estimates.append(estimate_layout(model, parameters, cluster, training))
        except ConfigError:
            continue  # resolve_degrees rejects it for this world size
    estimates.sort(key=rank_key)
    return Plan(model, cluster, training, estimates,
                zero_stage_bytes(model, cluster.world_size, training),
                pipeline or PipelineOptions(), cp_comm_type)


_COUNT_LADDER = (*range(1, 17), 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256, 384, 512)


def smallest_fitting_count(
    model: ModelSpec, training: Training, build: Callable[[int], Cluster], *, above: int = 0,
    reshard: Reshard = None, pipeline: PipelineOptions | None = None, cp_comm_type: str = "p2p",
) -> tuple[int, Plan] | None:
    """The fewest hosts (more than `above`, up to 512) on which some layout fits.

    `build(count)` makes the cluster of `count` hosts. None when even 512 do not suffice.
    """
    for count in (c for c in _COUNT_LADDER if c > above):
        plan = plan_layouts(model, build(count), training, reshard, pipeline, cp_comm_type)
        if plan.best is not None and plan.best.fits:
            return count, plan
    return None


def longest_sequence(model: ModelSpec, parameters: SMPParameters, cluster: Cluster,
                     training: Training) -> int | None:
    """The longest sequence (tokens, a multiple of 2 x cp) with which this layout fits on
    `cluster`, `training.micro_batch` rows per data-parallel rank; None when fit cannot be
    judged (no GPU memory), 0 when none fits (meshtrain.plan.context.max_seq_len)."""
    def fits(seq_len: int) -> bool | None:
        one = dataclasses.replace(training, seq_len=seq_len)
        try:
            return estimate_layout(model, parameters, cluster, one).fits
        except ConfigError:
            return False  # e.g. heads an a2a layout cannot scatter: no length fits
    return max_seq_len(fits, parameters.context_parallel_degree)


def reasoning(estimate: LayoutEstimate, plan: Plan) -> str:
    """Why this layout ranks where it does, in one or two sentences."""
    capacity = estimate.capacity_bytes
    peak = estimate.memory.peak_bytes / GIB
    if capacity is None:
        unit = plan.cluster.rank_unit
        fit = (f"needs {peak:.1f} GiB per {unit}" + (" (no GPU memory to compare with)"
                                                      if unit == "GPU" else ""))
    elif estimate.fits:
        fit = f"fits: {peak:.1f} of {capacity / GIB:.1f} GiB usable per GPU"
    else:
        fit = f"does not fit: {peak:.1f} GiB > {capacity / GIB:.1f} GiB usable per GPU"
    parts = [fit, _biggest_part(estimate)]
    time = estimate.time
    overlapped = time.compute_s >= time.overlapped_comm_s
    bound = "compute-bound" if overlapped else "bound by FSDP/DP traffic"
    parts.append(f"~{time.tokens_per_s:,.0f} tokens/s ({bound}; exposed TP/EP/CP communication "
                 f"{time.exposed_comm_s * 1e3:.0f} ms per step)")
    if estimate.pipeline is not None:
        terms = estimate.pipeline
        parts.append(f"the pipeline's {terms.schedule} bubble idles {time.bubble_fraction:.0%} of "
                     f"the step; its {terms.peak_stage} rank peaks")
    return "; ".join(parts) + "."


def _biggest_part(estimate: LayoutEstimate) -> str:
    """The peak phase and the term that tips it over the capacity (or its largest term)."""
    phase = estimate.memory.peak_phase
    term = tipping_term(phase, estimate.capacity_bytes)
    what = "tips it" if estimate.fits is False and term != phase.largest_term else "largest"
    if estimate.fits is False:
        return (f"peak in the {phase.name.replace('_', ' ')} phase; {term.replace('_', ' ')} "
                f"{phase.terms[term] / GIB:.1f} GiB {what}")
    return (f"peak in the {phase.name.replace('_', ' ')} phase (largest part: "
            f"{term.replace('_', ' ')} {phase.terms[term] / GIB:.1f} GiB)")


def tipping_term(phase: PhaseMemory, capacity: int | None) -> str:
    """The term of `phase` without which it would fit in `capacity` (the smallest such term:
    the one that tips it; on a tie a buffer rather than a model state or activations), else
    its largest term."""
    if capacity is None or phase.total <= capacity:
        return phase.largest_term
    enough = [k for k, v in phase.terms.items() if phase.total - v <= capacity]
    if not enough:
        return phase.largest_term
    return min(enough, key=lambda k: (phase.terms[k], k in RESIDENT_TERMS))


__all__ = [
    "LayoutEstimate",
    "PipelineOptions",
    "Plan",
    "candidate_parameters",
    "estimate_layout",
    "longest_sequence",
    "plan_layouts",
    "rank_key",
    "reasoning",
    "resolve_reshard",
    "smallest_fitting_count",
    "tipping_term",
]
