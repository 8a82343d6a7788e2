"""The named axes of a job's device mesh, their order, and their sizes for resolved degrees.

The runtime builds ONE world mesh (a 1-D ``world`` axis over every rank) and views it in two
layouts, outermost first (``meshtrain_runtime.mesh``, torchtitan's ``ParallelDims`` style):

- dense layers (FSDP/HSDP, TP): ``replicate x shard x tp``; tensor-parallel ranks are contiguous,
  ``rank = (replicate * shard + s) * tp + t``;
- expert layers: ``replicate x shard_mod_ep x ep``: expert parallelism is carved out of each
  sharding group, innermost (``shard = shard_mod_ep x ep``; the contract refuses EP with TP).

`FLATTENED` axes join axes of the dense layout. Nothing here imports torch: the client plans with
the same names and shapes.
"""

from __future__ import annotations

from enum import StrEnum

from meshtrain.contract.degrees import ResolvedDegrees


class MeshAxis(StrEnum):
    """A named axis of the device mesh (the value is the DeviceMesh dim name)."""

    WORLD = "world"
    """Every rank, in global rank order: the one mesh the others are views of."""
    REPLICATE = "replicate"
    """Replicas of the model (HSDP's outer axis, SMP's "rep rank")."""
    SHARD = "shard"
    """The sharding (FSDP) group inside one replica."""
    TP = "tp"
    """Tensor parallelism (contiguous global ranks)."""
    SHARD_MOD_EP = "shard_mod_ep"
    """The sharding group divided by the EP degree: the ranks that hold the same experts."""
    EP = "ep"
    """Expert parallelism (the innermost part of the sharding group)."""
    DP = "dp"
    """Flattened ``replicate x shard``: every rank that sees different data (without CP)."""
    REPLICA = "replica"
    """Flattened ``shard x tp``: the ranks of one whole replica."""


DENSE_AXES: tuple[MeshAxis, ...] = (MeshAxis.REPLICATE, MeshAxis.SHARD, MeshAxis.TP)
"""The layout of dense layers (``state.mesh``), outermost first."""

EXPERT_AXES: tuple[MeshAxis, ...] = (MeshAxis.REPLICATE, MeshAxis.SHARD_MOD_EP, MeshAxis.EP)
"""The layout of expert layers (``state.expert_mesh``), outermost first."""

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
    sizes = {
        MeshAxis.WORLD: degrees.world_size,
        MeshAxis.REPLICATE: degrees.replicate_degree,
        MeshAxis.SHARD: degrees.hybrid_shard_degree,
        MeshAxis.TP: degrees.tensor_parallel_degree,
        MeshAxis.SHARD_MOD_EP: degrees.hybrid_shard_degree // degrees.expert_parallel_degree,
        MeshAxis.EP: degrees.expert_parallel_degree,
    }
    return sizes[axis]


def mesh_shape(
    degrees: ResolvedDegrees, axes: tuple[MeshAxis, ...] = DENSE_AXES
) -> tuple[int, ...]:
    """The sizes of `axes` (default: the dense layout) for `degrees`."""
    return tuple(axis_size(degrees, axis) for axis in axes)


def axis_names(axes: tuple[MeshAxis, ...]) -> tuple[str, ...]:
    """Plain ``str`` names for DeviceMesh ``mesh_dim_names``."""
    return tuple(axis.value for axis in axes)


__all__ = [
    "DENSE_AXES",
    "EXPERT_AXES",
    "FLATTENED",
    "MeshAxis",
    "axis_names",
    "axis_size",
    "mesh_shape",
]
