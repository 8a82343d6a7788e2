"""The named axes of a job's device mesh, their order, and their sizes for resolved degrees.

The mesh, stated once (``meshtrain_runtime.mesh`` builds it; docs/architecture.md draws it):
ONE world mesh (a 1-D ``world`` axis over every rank) laid out, outermost first, as
``pp x replicate x shard x tp`` (`LAYOUT_AXES`)::

    rank = ((pp * replicate + r) * shard + s) * tp + t

- ``pp``: pipeline stages, outermost; every other size counts ranks within one stage
  (``hybrid_shard_degree`` included, cp ranks included in it);
- ``tp``: tensor-parallel ranks are contiguous (SMP's example scripts: ``tp_rank = rank % tp``);
- context parallelism is carved out of the sharding group, innermost in it:
  ``shard = shard_mod_cp x cp`` (`CONTEXT_AXES`);
- expert parallelism is folded inside the sharding group, innermost:
  ``shard = shard_mod_ep x ep`` (`EXPERT_AXES`); with tensor parallelism it is folded over the
  ``shard x tp`` ranks (Megatron-Core's parallel folding): ``shard x tp = shard_mod_ep x ep``,
  so an EP group spans tp ranks (which split their shared tokens before dispatch).

Ranks that see different rows of data: ``dp_size = world / (pp x tp x cp)``, a rank's row index
``dp_rank = dp // cp`` where ``dp`` is its index in the flattened ``replicate x shard`` axis
(without pp: ``rank // (tp x cp)``, as AWS's SMP scripts compute it). Stages get views of the one
mesh, per stage: `DENSE_AXES` (FSDP/HSDP, TP), `CONTEXT_AXES`, `EXPERT_AXES`; `FLATTENED` axes
join axes of the dense view. Nothing here imports torch: the client plans with the same names.
"""

from __future__ import annotations

from enum import StrEnum

from meshtrain.contract.degrees import ResolvedDegrees


class MeshAxis(StrEnum):
    """A named axis of the device mesh (the value is the DeviceMesh dim name)."""

    WORLD = "world"
    """Every rank, in global rank order: the one mesh the others are views of."""
    PP = "pp"
    """Pipeline stages (outermost)."""
    REPLICATE = "replicate"
    """Replicas of the model (HSDP's outer axis, SMP's "rep rank")."""
    SHARD = "shard"
    """The sharding (FSDP) group of one replica of one stage, context-parallel ranks included."""
    TP = "tp"
    """Tensor parallelism (contiguous global ranks)."""
    SHARD_MOD_CP = "shard_mod_cp"
    """The sharding group divided by the CP degree: ranks that see different rows."""
    CP = "cp"
    """Context parallelism (the innermost part of the sharding group): ranks that split a row."""
    SHARD_MOD_EP = "shard_mod_ep"
    """The sharding group divided by the EP degree: the ranks that hold the same experts."""
    EP = "ep"
    """Expert parallelism (the innermost part of the sharding group)."""
    DP = "dp"
    """Flattened ``replicate x shard``: the ranks gradients are reduced over (cp included)."""
    REPLICA = "replica"
    """Flattened ``shard x tp``: the ranks of one whole replica of one stage."""


LAYOUT_AXES: tuple[MeshAxis, ...] = (MeshAxis.PP, MeshAxis.REPLICATE, MeshAxis.SHARD, MeshAxis.TP)
"""The world's layout, outermost first: what the 1-D world mesh is unflattened into."""

DENSE_AXES: tuple[MeshAxis, ...] = (MeshAxis.REPLICATE, MeshAxis.SHARD, MeshAxis.TP)
"""The layout of dense layers within one stage (``state.mesh``), outermost first."""

CONTEXT_AXES: tuple[MeshAxis, ...] = (
    MeshAxis.REPLICATE, MeshAxis.SHARD_MOD_CP, MeshAxis.CP, MeshAxis.TP
)
"""One stage with the context-parallel group carved out of the sharding group (innermost)."""

EXPERT_AXES: tuple[MeshAxis, ...] = (MeshAxis.REPLICATE, MeshAxis.SHARD_MOD_EP, MeshAxis.EP)
"""The layout of expert layers within one stage (``state.expert_mesh``), outermost first."""

SHARD_SPLITS: dict[MeshAxis, tuple[MeshAxis, MeshAxis]] = {
    MeshAxis.CP: (MeshAxis.SHARD_MOD_CP, MeshAxis.CP),
    MeshAxis.EP: (MeshAxis.SHARD_MOD_EP, MeshAxis.EP),
}
"""The two parts (outer, inner) the ``shard`` axis is split into for each carved-out axis."""

FLATTENED: dict[MeshAxis, tuple[MeshAxis, ...]] = {
    MeshAxis.DP: (MeshAxis.REPLICATE, MeshAxis.SHARD),
    MeshAxis.REPLICA: (MeshAxis.SHARD, MeshAxis.TP),
}
"""Each flattened axis and the dense axes it joins, in mesh order."""


def axis_size(degrees: ResolvedDegrees, axis: MeshAxis) -> int:
    """The size of `axis` for `degrees` (a flattened axis: the product of its parts)."""
    if axis in FLATTENED:
        size = 1
        for part in FLATTENED[axis]:
            size *= axis_size(degrees, part)
        return size
    shard = degrees.hybrid_shard_degree
    sizes = {
        MeshAxis.WORLD: degrees.world_size,
        MeshAxis.PP: degrees.pipeline_parallel_degree,
        MeshAxis.REPLICATE: degrees.replicate_degree,
        MeshAxis.SHARD: shard,
        MeshAxis.TP: degrees.tensor_parallel_degree,
        MeshAxis.SHARD_MOD_CP: shard // degrees.context_parallel_degree,
        MeshAxis.CP: degrees.context_parallel_degree,
        MeshAxis.SHARD_MOD_EP: _ep_folded(shard, degrees.tensor_parallel_degree,
                                          degrees.expert_parallel_degree)
        // degrees.expert_parallel_degree,
        MeshAxis.EP: degrees.expert_parallel_degree,
    }
    return sizes[axis]


def _ep_folded(shard: int, tp: int, ep: int, tp_index: int | None = None) -> int:
    """The group EP is carved from: shard x tp with EP and TP (folded), else shard; with
    `tp_index`, a rank's index in it instead of its size."""
    if ep == 1 or tp == 1:
        return shard
    return shard * tp + tp_index if tp_index is not None else shard * tp


def mesh_shape(
    degrees: ResolvedDegrees, axes: tuple[MeshAxis, ...] = DENSE_AXES
) -> tuple[int, ...]:
    """The sizes of `axes` (default: the dense layout) for `degrees`."""
    return tuple(axis_size(degrees, axis) for axis in axes)


def describe_mesh(degrees: ResolvedDegrees) -> str:
    """The layout in one line, e.g. ``pp 2 x replicate 1 x shard 2 x tp 2 (ep 2 over shard x
    tp)``: every layout axis with its size, then the axes carved out of the sharding group."""
    text = " x ".join(f"{axis.value} {axis_size(degrees, axis)}" for axis in LAYOUT_AXES)
    carved = []
    if degrees.context_parallel_degree > 1:
        carved.append(f"cp {degrees.context_parallel_degree} within shard")
    if degrees.expert_parallel_degree > 1:
        over = "shard x tp" if degrees.tensor_parallel_degree > 1 else "shard"
        carved.append(f"ep {degrees.expert_parallel_degree} within {over}")
    return text + (f" ({', '.join(carved)})" if carved else "")


def axis_names(axes: tuple[MeshAxis, ...]) -> tuple[str, ...]:
    """Plain ``str`` names for DeviceMesh ``mesh_dim_names``."""
    return tuple(axis.value for axis in axes)


def rank_coordinates(degrees: ResolvedDegrees, rank: int) -> dict[MeshAxis, int]:
    """Where global `rank` sits on every axis (the rank formula above, without torch)."""
    tp, shard = degrees.tensor_parallel_degree, degrees.hybrid_shard_degree
    t, rest = rank % tp, rank // tp
    s, rest = rest % shard, rest // shard
    replicate, pp = rest % degrees.replicate_degree, rest // degrees.replicate_degree
    cp, ep = degrees.context_parallel_degree, degrees.expert_parallel_degree
    return {
        MeshAxis.WORLD: rank, MeshAxis.PP: pp, MeshAxis.REPLICATE: replicate,
        MeshAxis.SHARD: s, MeshAxis.TP: t,
        MeshAxis.SHARD_MOD_CP: s // cp, MeshAxis.CP: s % cp,
        MeshAxis.SHARD_MOD_EP: _ep_folded(s, tp, ep, t) // ep,
        MeshAxis.EP: _ep_folded(s, tp, ep, t) % ep,
        MeshAxis.DP: replicate * shard + s, MeshAxis.REPLICA: s * tp + t,
    }


__all__ = [
    "CONTEXT_AXES",
    "DENSE_AXES",
    "EXPERT_AXES",
    "FLATTENED",
    "LAYOUT_AXES",
    "SHARD_SPLITS",
    "MeshAxis",
    "axis_names",
    "axis_size",
    "describe_mesh",
    "mesh_shape",
    "rank_coordinates",
]
