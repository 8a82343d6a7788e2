"""A plan as JSON (for programs; schema in docs/planner.md) or as a rich table (for people)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from meshtrain.plan.cluster import GIB
from meshtrain.plan.layouts import (
    LayoutEstimate,
    Plan,
    longest_sequence,
    reasoning,
    tipping_term,
)
from meshtrain.plan.legend import PHASE_LEGEND, cluster_text, column_legend, speed_text

SCHEMA_VERSION = 4
"""2: `memory_bytes.phases` and `memory_bytes.peak_phase` added; 3: `degrees.reshard_after_forward`,
the encoder-decoder fields of `model` and `training.decoder_seq_len`; 4: pipeline parallelism
(meshtrain.plan.schema) (every earlier field keeps its meaning)."""
_STRATEGY_NAMES = {"full_shard": "zero3", "hybrid_shard": "zero3 (hybrid)",
                   "shard_grad_op": "zero2", "_hybrid_shard_zero2": "zero2 (hybrid)",
                   "no_shard": "ddp"}


def _int(value: float | None) -> int | None:
    return None if value is None else math.ceil(value)


def distribution_for(estimate: LayoutEstimate) -> dict[str, Any]:
    """The Estimator `distribution` dict that asks the runtime for this layout."""
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": estimate.layout}}}


def estimate_to_dict(estimate: LayoutEstimate, plan: Plan, rank: int) -> dict[str, Any]:
    """One candidate as JSON-ready data (bytes are integers, per GPU)."""
    degrees, time = estimate.degrees, estimate.time
    return {
        "rank": rank,
        "layout": estimate.layout,
        "distribution": distribution_for(estimate),
        "degrees": {
            "world_size": degrees.world_size, "replicate_degree": degrees.replicate_degree,
            "hybrid_shard_degree": degrees.hybrid_shard_degree,
            "tensor_parallel_degree": degrees.tensor_parallel_degree,
            "expert_parallel_degree": degrees.expert_parallel_degree,
            "context_parallel_degree": degrees.context_parallel_degree,
            "data_parallel_degree": degrees.data_parallel_degree,
            "sharding_strategy": degrees.sharding_strategy,
            "reshard_after_forward": estimate.reshard_after_forward,
            "pipeline_parallel_degree": degrees.pipeline_parallel_degree,
        },
        "fits": estimate.fits,
        "pipeline": _pipeline_dict(estimate),
        "memory_bytes": _memory_dict(estimate),
        "activations": _activations_dict(estimate),
        "communication_bytes_per_step": {
            name: _int(getattr(estimate.comm, name)) for name in (
                "fsdp_all_gather", "fsdp_reduce_scatter", "data_parallel_all_reduce",
                "tensor_parallel", "expert_all_to_all", "context_parallel", "pipeline_p2p",
                "total")},
        "estimate": {
            "compute_s": time.compute_s, "overlapped_communication_s": time.overlapped_comm_s,
            "exposed_communication_s": time.exposed_comm_s, "step_s": time.step_s,
            "tokens_per_step": time.tokens_per_step, "tokens_per_s": time.tokens_per_s,
            "bubble_fraction": time.bubble_fraction,
        },
        "reasoning": reasoning(estimate, plan),
    }


def _pipeline_dict(estimate: LayoutEstimate) -> dict[str, Any] | None:
    terms = estimate.pipeline
    if terms is None:
        return None
    return {
        "schedule": terms.schedule, "microbatches": terms.microbatches,
        "stages_per_rank": terms.stages_per_rank, "rows_per_microbatch": terms.rows_per_microbatch,
        "blocks_per_stage": terms.blocks_per_stage, "in_flight_first": terms.in_flight_first,
        "in_flight_last": terms.in_flight_last, "bubble_fraction": terms.bubble_fraction,
        "p2p_bytes_per_boundary": _int(terms.p2p_bytes_per_boundary),
        "p2p_bytes_per_rank": _int(terms.p2p_bytes_per_rank), "peak_stage": terms.peak_stage,
    }


def _memory_dict(estimate: LayoutEstimate) -> dict[str, Any]:
    memory = estimate.memory
    return {
        "parameters": memory.states.parameters, "gradients": memory.states.gradients,
        "optimizer_states": memory.states.optimizer_states,
        "model_states": memory.states.total, "activations": _int(memory.activations),
        "temporary_buffers": _int(memory.temporary_bytes),
        "temporary_breakdown": {k: _int(v) for k, v in memory.temporary.items()},
        "optimizer_step_buffers": memory.optimizer_step, "peak": _int(memory.peak_bytes),
        "reserve": memory.reserve, "capacity": estimate.capacity_bytes,
        "headroom": _int(estimate.headroom_bytes),
        "peak_phase": memory.peak_phase.name,
        "phases": {phase.name: {"total": _int(phase.total),
                                "terms": {k: _int(v) for k, v in phase.terms.items()}}
                   for phase in memory.phases},
    }


def _activations_dict(estimate: LayoutEstimate) -> dict[str, Any]:
    acts = estimate.activations
    return {
        "per_layer": _int(acts.layer_bytes),
        "per_layer_breakdown": {k: _int(v) for k, v in acts.layer_terms.items()},
        "layers_stored_in_full": acts.num_layers - acts.num_checkpointed,
        "layers_checkpointed": acts.num_checkpointed,
        "checkpoints_on_gpu": acts.num_checkpoints_on_gpu,
        "per_checkpoint": _int(acts.checkpoint_bytes),
        "model_terms": {k: _int(v) for k, v in acts.model_terms.items()},
        "encoder_layers": acts.num_encoder_layers,
        "per_encoder_layer": _int(acts.encoder_layer_bytes),
    }


def plan_to_dict(
    plan: Plan, *, top: int | None = None, smallest_fitting_node_count: int | None = None
) -> dict[str, Any]:
    """The whole plan as JSON-ready data (meshtrain.plan.schema); `top` limits the candidates.

    `smallest_fitting_node_count`: when nothing fits, the fewest hosts of this kind that do.
    """
    model, cluster, training = plan.model, plan.cluster, plan.training
    ranked = list(enumerate(plan.candidates, start=1))
    best = plan.best
    listed = ranked if top is None else ranked[:top]
    return {
        "schema_version": SCHEMA_VERSION,
        "convention": training.convention,
        "model": {
            "name": model.name, "source": model.source, "family": model.family,
            "num_params": model.num_params, "hidden_size": model.hidden_size,
            "num_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.num_key_value_heads,
            "intermediate_size": model.intermediate_size, "vocab_size": model.vocab_size,
            "num_experts": model.num_experts, "experts_per_token": model.experts_per_token,
            "num_decoder_layers": model.num_decoder_layers,
        },
        "cluster": {
            "instance_type": cluster.instance_type, "num_nodes": cluster.num_nodes,
            "ranks_per_node": cluster.ranks_per_node, "world_size": cluster.world_size,
            "gpu_memory_bytes": cluster.gpu_memory_bytes, "reserve_bytes": cluster.reserve_bytes,
            "capacity_bytes": cluster.capacity_bytes,
        },
        "training": {
            "seq_len": training.seq_len, "micro_batch": training.micro_batch,
            "precision": training.precision, "optimizer": training.optimizer,
            "fused_optimizer": training.fused_optimizer,
            "optimizer_offload": training.optimizer_offload,
            "compute_efficiency": training.compute_efficiency,
            "decoder_seq_len": training.decoder_seq_len,
            "microbatches": plan.pipeline.microbatches,
            "pipeline_schedule": plan.pipeline.schedule,
        },
        "model_state_bytes_per_gpu": plan.model_state_bytes_per_gpu,
        "num_candidates": len(plan.candidates),
        "num_fitting": sum(1 for c in plan.candidates if c.fits),
        "recommendation": None if best is None else estimate_to_dict(
            best, plan, plan.candidates.index(best) + 1),
        "candidates": [estimate_to_dict(c, plan, rank) for rank, c in listed],
        "smallest_fitting_node_count": smallest_fitting_node_count,
    }


def short_layout(estimate: LayoutEstimate) -> str:
    """e.g. 'shard 8 x rep 2 | tp 2+sp | zero3 (hybrid) | ckpt+offload'."""
    d, p = estimate.degrees, estimate.parameters
    parts = [] if estimate.pipeline is None else [_pipeline_text(estimate)]
    parts.append(f"shard {d.hybrid_shard_degree}" + (f" x rep {d.replicate_degree}"
                                                      if d.replicate_degree > 1 else ""))
    if d.tensor_parallel_degree > 1:
        parts.append(f"tp {d.tensor_parallel_degree}" + ("+sp" if p.sequence_parallel else ""))
    if d.expert_parallel_degree > 1:
        parts.append(f"ep {d.expert_parallel_degree}")
    if d.context_parallel_degree > 1:
        parts.append(f"cp {d.context_parallel_degree}")
    parts.append(_STRATEGY_NAMES[d.sharding_strategy])
    if p.reshard_after_forward != "auto":
        parts.append("reshard" if p.reshard_after_forward else "no reshard")
    if p.activation_checkpointing:
        name = "sac" if p.checkpointing_policy == "selective" else "ckpt"
        parts.append(f"{name}+offload" if p.activation_offloading else name)
    if p.cpu_offload:
        parts.append("cpu offload")
    return " | ".join(parts)


def _pipeline_text(estimate: LayoutEstimate) -> str:
    """e.g. 'pp 2 (1F1B, 8 mb, bubble 11%)'."""
    terms = estimate.pipeline
    assert terms is not None
    virtual = f" x{terms.stages_per_rank}" if terms.stages_per_rank > 1 else ""
    return (f"pp {terms.degree}{virtual} ({terms.schedule}, {terms.microbatches} mb, bubble "
            f"{terms.bubble_fraction:.0%})")


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


# (header, justify, priority): with less room the higher priorities are dropped first.
_COLUMNS = (("#", "right", 0), ("pp", "right", 0), ("layout", "left", 0), ("peak GiB", "right", 0),
            ("fits", "center", 0), ("phase", "left", 1), ("tokens/s", "right", 1),
            ("states", "right", 2), ("activations", "right", 2), ("temp", "right", 3),
            ("comm GB/step", "right", 3))
_WIDE = 120
_MEDIUM = 100


def _row(rank: int, estimate: LayoutEstimate) -> dict[str, str]:
    memory = estimate.memory
    return {
        "#": str(rank), "pp": str(estimate.degrees.pipeline_parallel_degree),
        "layout": short_layout(estimate), "peak GiB": _gib(memory.peak_bytes),
        "fits": {True: "[green]yes[/]", False: "[red]no[/]", None: "?"}[estimate.fits],
        "phase": memory.peak_phase.name.replace("optimizer_step", "step"),
        "tokens/s": f"{estimate.time.tokens_per_s:,.0f}", "states": _gib(memory.states.total),
        "activations": _gib(memory.activations), "temp": _gib(memory.temporary_bytes),
        "comm GB/step": f"{estimate.comm.total / 1e9:.1f}",
    }


def table_columns(width: int) -> tuple[list[str], list[str]]:
    """(columns shown, columns left out) at `width`: dropped by priority, never silently (the
    caller names those left out)."""
    limit = 3 if width >= _WIDE else 2 if width >= _MEDIUM else 1
    return ([name for name, _, priority in _COLUMNS if priority <= limit],
            [name for name, _, priority in _COLUMNS if priority > limit])


def build_table(plan: Plan, *, top: int = 10, width: int = _WIDE) -> Table:
    """The ranked candidates as a rich table (GiB per rank, GB sent per rank per step).

    Columns are dropped by priority to fit `width` (the terminal's): at 80 columns the rank,
    layout, peak, fit, peak phase and tokens/s remain; the layout column folds.
    """
    shown = table_columns(width)[0]
    columns = [column for column in _COLUMNS if column[0] in shown]
    table = Table(title=f"{plan.model.name} on {cluster_text(plan.cluster)}", show_lines=False)
    for name, justify, _ in columns:
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         overflow="fold" if name == "layout" else "ellipsis")
    for rank, estimate in enumerate(plan.candidates[:top], start=1):
        row = _row(rank, estimate)
        table.add_row(*(row[name] for name, _, _ in columns))
    return table


def phase_table(estimate: LayoutEstimate, unit: str = "GPU") -> Table:
    """One layout's phases (columns) by term (rows), GiB per rank; the peak phase marked."""
    memory = estimate.memory
    peak = memory.peak_phase.name
    table = Table(title=f"Memory per {unit} by phase (GiB): {short_layout(estimate)}")
    table.add_column("term")
    for phase in memory.phases:
        label = phase.name.replace("optimizer_step", "step")
        table.add_column(f"[bold]{label}*[/]" if phase.name == peak else label, justify="right")
    terms = list(dict.fromkeys(term for phase in memory.phases for term in phase.terms))
    for term in terms:
        values = [phase.terms.get(term) for phase in memory.phases]
        if not any(values):
            continue
        table.add_row(term.replace("_", " "), *("" if v is None else _gib(v) for v in values))
    table.add_row("[bold]total[/]", *(f"[bold]{_gib(p.total)}[/]" for p in memory.phases))
    return table


def render_plan(plan: Plan, console: Console, *, top: int = 10) -> None:
    """Print the table with what its columns mean and the speeds it assumes, the ZeRO-stage
    model states, and the recommendation with its reasons and its memory by phase."""
    console.print(build_table(plan, top=top, width=console.width))
    _print_legend(plan, console)
    stages = plan.model_state_bytes_per_gpu
    console.print(
        f"Model states per {plan.cluster.rank_unit} over {stages['data_parallel_degree']} "
        f"data-parallel ranks "
        f"({plan.training.convention} convention): " + ", ".join(
            f"{name} {_gib(stages[name])} GiB" for name in ("ddp", "zero1", "zero2", "zero3")))
    best = plan.best
    if best is None:
        console.print("[red]No layout fits.[/] Use more or larger GPUs, a shorter sequence or "
                      "a smaller micro-batch.")
        return
    console.print(f"[bold]Recommended:[/] {best.describe()}")
    console.print(f"  Why: it {reasoning(best, plan)}")
    console.print(phase_table(best, plan.cluster.rank_unit))
    console.print(PHASE_LEGEND, highlight=False)
    _print_longest(plan, console)


def longest_by_context_degree(plan: Plan) -> list[tuple[LayoutEstimate, int | None]]:
    """The recommended layout and, per context_parallel_degree it does not use, the best-ranked
    layout of that degree, each with the longest sequence it fits (`longest_sequence`)."""
    chosen = [] if plan.best is None else [plan.best]
    for estimate in plan.candidates:
        if estimate.degrees.context_parallel_degree not in {
                e.degrees.context_parallel_degree for e in chosen}:
            chosen.append(estimate)
    chosen.sort(key=lambda e: e.degrees.context_parallel_degree)
    return [(e, longest_sequence(plan.model, e.parameters, plan.cluster, plan.training))
            for e in chosen]


def _print_longest(plan: Plan, console: Console) -> None:
    if plan.cluster.capacity_bytes is None:
        return
    console.print(f"Longest sequence that fits ({plan.training.micro_batch} row(s) per "
                  "data-parallel rank; a multiple of 2 x cp), by context_parallel_degree:",
                  highlight=False)
    for estimate, tokens in longest_by_context_degree(plan):
        cp = estimate.degrees.context_parallel_degree
        how = f" ({plan.cp_comm_type})" if cp > 1 else ""
        mark = " (recommended)" if estimate is plan.best else ""
        console.print(f"  cp {cp}{how}: {tokens:,} tokens with {short_layout(estimate)}{mark}",
                      highlight=False)


def _print_legend(plan: Plan, console: Console) -> None:
    shown, left_out = table_columns(console.width)
    capacity = plan.cluster.capacity_bytes
    console.print("Columns:", highlight=False)
    console.print(column_legend(shown, left_out, unit=plan.cluster.rank_unit,
                                usable_gib=None if capacity is None else capacity / GIB))
    console.print(speed_text(plan.cluster, plan.training.compute_efficiency), highlight=False)
    pipelined = [c.pipeline for c in plan.candidates if c.pipeline is not None]
    if pipelined:
        console.print(f"Pipeline layouts: {pipelined[0].schedule} over "
                      f"{pipelined[0].microbatches} microbatches of "
                      f"{pipelined[0].rows_per_microbatch} row(s) per data-parallel rank "
                      "(--microbatches, --pipeline-schedule).", highlight=False)


def memory_text(estimate: LayoutEstimate) -> str:
    """Plain-text memory breakdown of one layout (for error messages): the phases, the peak
    phase's terms and the one that tips it over the GPU's capacity."""
    memory = estimate.memory
    phase = memory.peak_phase
    capacity = estimate.capacity_bytes
    term = tipping_term(phase, capacity)
    label = phase.name.replace("_", " ")
    lines = [
        f"  model states: parameters {_gib(memory.states.parameters)} GiB, gradients "
        f"{_gib(memory.states.gradients)} GiB, optimizer states "
        f"{_gib(memory.states.optimizer_states)} GiB",
        "  by phase: " + ", ".join(f"{p.name.replace('_', ' ')} {_gib(p.total)} GiB"
                                   for p in memory.phases),
        f"  peak in the {label} phase: " + ", ".join(
            f"{k.replace('_', ' ')} {_gib(v)}" for k, v in phase.terms.items() if v) + " GiB",
        f"  peak {_gib(memory.peak_bytes)} GiB per GPU"
        + ("" if capacity is None else
           f" vs {_gib(capacity)} GiB usable (GPU memory minus a {_gib(memory.reserve)} GiB "
           "reserve)"),
    ]
    if capacity is not None and phase.total > capacity:
        lines.append(f"  what tips it: {term.replace('_', ' ')} ({_gib(phase.terms[term])} GiB "
                     f"in the {label} phase)" + _remedy(term))
    return "\n".join(lines)


_REMEDIES = {
    "activations": "; activation checkpointing, a shorter sequence or a smaller micro-batch "
                   "reduce it",
    "loss_temporaries": "; fp32 logits of tokens x vocabulary: a shorter sequence, a smaller "
                        "micro-batch or tensor parallelism with loss_parallel reduce them",
    "optimizer_step_buffer": "; torch.optim.AdamW(..., fused=True) needs none",
    "optimizer_states": "; more sharding (a larger hybrid_shard_degree) or cpu_offload reduce them",
    "sharded_parameters": "; more sharding or cpu_offload reduce them",
    "gathered_parameters": "; reshard_after_forward: true (the default sharding strategy, "
                           "not shard_grad_op or no_shard) or tensor parallelism reduce them",
}


def _remedy(term: str) -> str:
    return _REMEDIES.get(term, "")


__all__ = [
    "SCHEMA_VERSION",
    "build_table",
    "distribution_for",
    "estimate_to_dict",
    "longest_by_context_degree",
    "memory_text",
    "phase_table",
    "plan_to_dict",
    "render_plan",
    "short_layout",
    "table_columns",
]
