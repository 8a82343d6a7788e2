"""A plan as JSON (for programs; schema in docs/planner.md) or as a rich table (for people)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from meshtrain.plan.cluster import GIB
from meshtrain.plan.layouts import LayoutEstimate, Plan, reasoning

SCHEMA_VERSION = 1
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
        },
        "fits": estimate.fits,
        "memory_bytes": _memory_dict(estimate),
        "activations": _activations_dict(estimate),
        "communication_bytes_per_step": {
            name: _int(getattr(estimate.comm, name)) for name in (
                "fsdp_all_gather", "fsdp_reduce_scatter", "data_parallel_all_reduce",
                "tensor_parallel", "expert_all_to_all", "context_parallel", "total")},
        "estimate": {
            "compute_s": time.compute_s, "overlapped_communication_s": time.overlapped_comm_s,
            "exposed_communication_s": time.exposed_comm_s, "step_s": time.step_s,
            "tokens_per_step": time.tokens_per_step, "tokens_per_s": time.tokens_per_s,
        },
        "reasoning": reasoning(estimate, plan),
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
            "compute_efficiency": training.compute_efficiency,
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
    parts = [f"shard {d.hybrid_shard_degree}" + (f" x rep {d.replicate_degree}"
                                                  if d.replicate_degree > 1 else "")]
    if d.tensor_parallel_degree > 1:
        parts.append(f"tp {d.tensor_parallel_degree}" + ("+sp" if p.sequence_parallel else ""))
    if d.expert_parallel_degree > 1:
        parts.append(f"ep {d.expert_parallel_degree}")
    if d.context_parallel_degree > 1:
        parts.append(f"cp {d.context_parallel_degree}")
    parts.append(_STRATEGY_NAMES[d.sharding_strategy])
    if p.activation_checkpointing:
        parts.append("ckpt+offload" if p.activation_offloading else "ckpt")
    if p.cpu_offload:
        parts.append("cpu offload")
    return " | ".join(parts)


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def build_table(plan: Plan, *, top: int = 10) -> Table:
    """The ranked candidates as a rich table (GiB per GPU, GB sent per GPU per step)."""
    table = Table(title=f"{plan.model.name} on {plan.cluster.description}", show_lines=False)
    for name, justify in (("#", "right"), ("layout", "left"), ("states", "right"),
                          ("activations", "right"), ("temp", "right"), ("peak GiB", "right"),
                          ("fits", "center"), ("comm GB/step", "right"), ("tokens/s", "right")):
        table.add_column(name, justify=justify)
    for rank, estimate in enumerate(plan.candidates[:top], start=1):
        memory = estimate.memory
        fits = {True: "[green]yes[/]", False: "[red]no[/]", None: "?"}[estimate.fits]
        table.add_row(str(rank), short_layout(estimate), _gib(memory.states.total),
                      _gib(memory.activations), _gib(memory.temporary_bytes),
                      _gib(memory.peak_bytes), fits, f"{estimate.comm.total / 1e9:.1f}",
                      f"{estimate.time.tokens_per_s:,.0f}")
    return table


def render_plan(plan: Plan, console: Console, *, top: int = 10) -> None:
    """Print the table, the ZeRO-stage model states and the recommendation with its reasons."""
    console.print(build_table(plan, top=top))
    stages = plan.model_state_bytes_per_gpu
    console.print(
        f"Model states per GPU over {stages['data_parallel_degree']} data-parallel GPUs "
        f"({plan.training.convention} convention): " + ", ".join(
            f"{name} {_gib(stages[name])} GiB" for name in ("ddp", "zero1", "zero2", "zero3")))
    best = plan.best
    if best is None:
        console.print("[red]No layout fits.[/] Use more or larger GPUs, a shorter sequence or "
                      "a smaller micro-batch.")
        return
    console.print(f"[bold]Recommended:[/] {best.describe()}")
    console.print(f"  Why: it {reasoning(best, plan)}")


def memory_text(estimate: LayoutEstimate) -> str:
    """Plain-text memory breakdown of one layout (for error messages)."""
    memory = estimate.memory
    lines = [
        f"  parameters {_gib(memory.states.parameters)} GiB, gradients "
        f"{_gib(memory.states.gradients)} GiB, optimizer states "
        f"{_gib(memory.states.optimizer_states)} GiB",
        f"  activations {_gib(memory.activations)} GiB, temporary buffers "
        f"{_gib(memory.temporary_bytes)} GiB, optimizer step buffers "
        f"{_gib(memory.optimizer_step)} GiB",
        f"  peak {_gib(memory.peak_bytes)} GiB per GPU"
        + ("" if estimate.capacity_bytes is None else
           f" vs {_gib(estimate.capacity_bytes)} GiB usable "
           f"(GPU memory minus a {_gib(memory.reserve)} GiB reserve)"),
    ]
    return "\n".join(lines)


__all__ = [
    "SCHEMA_VERSION",
    "build_table",
    "distribution_for",
    "estimate_to_dict",
    "memory_text",
    "plan_to_dict",
    "render_plan",
    "short_layout",
]
