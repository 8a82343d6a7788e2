"""The one device mesh of a job, built once from the resolved degrees (torchtitan's ParallelDims).

``build_meshes`` creates ONE DeviceMesh over every rank (the 1-D ``world`` axis) and unflattens it
into the layouts of ``meshtrain.contract.mesh_axes``; every other mesh a stage gets is a view of
it: a slice (``dense[REPLICATE, SHARD]`` for HSDP, ``dense[TP]``) or a flattened axis (``dp``,
``replica``). Axis names come from `MeshAxis`, never from string literals.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshtrain.contract import ResolvedDegrees
from meshtrain.contract.mesh_axes import (
    DENSE_AXES,
    EXPERT_AXES,
    FLATTENED,
    MeshAxis,
    axis_names,
    mesh_shape,
)


@dataclass(frozen=True)
class Meshes:
    """The world mesh and the views of it that the stages get."""

    world: DeviceMesh
    """1-D, every rank in global order (axis ``world``)."""
    dense: DeviceMesh
    """``replicate x shard x tp``: what FSDP/HSDP and TP slice (``state.mesh``)."""
    expert: DeviceMesh | None
    """``replicate x shard_mod_ep x ep`` with EP, else None (``state.expert_mesh``)."""
    dp: DeviceMesh
    """1-D flattened ``replicate x shard``: ranks that see different data (before CP)."""
    replica: DeviceMesh
    """1-D flattened ``shard x tp``: the ranks of this rank's replica."""

    def coordinate(self, axis: MeshAxis) -> int:
        """This rank's index along `axis` (0 along an expert axis without expert parallelism)."""
        if axis in DENSE_AXES:
            return self.dense.get_local_rank(axis.value)
        if axis in EXPERT_AXES:
            if self.expert is not None:
                return self.expert.get_local_rank(axis.value)
            # without EP: shard_mod_ep is the whole sharding group and ep has size 1
            return self.coordinate(MeshAxis.SHARD) if axis is MeshAxis.SHARD_MOD_EP else 0
        return self.submesh(axis).get_local_rank()

    def submesh(self, *axes: MeshAxis) -> DeviceMesh:
        """The view of `axes` (all of the dense layout, or all of the expert layout, or one
        flattened axis) that contains this rank."""
        if len(axes) == 1 and axes[0] in FLATTENED:
            return self.dp if axes[0] is MeshAxis.DP else self.replica
        if len(axes) == 1 and axes[0] is MeshAxis.WORLD:
            return self.world
        if all(axis in DENSE_AXES for axis in axes):
            return self.dense[axis_names(axes)]
        if self.expert is not None and all(axis in EXPERT_AXES for axis in axes):
            return self.expert[axis_names(axes)]
        raise ValueError(f"no mesh holds the axes {axis_names(axes)} in this job")


def build_meshes(degrees: ResolvedDegrees, device_type: str) -> Meshes:
    """Build the world mesh and its views (collective: every rank calls it, in the same order)."""
    world = init_device_mesh(
        device_type, (degrees.world_size,), mesh_dim_names=axis_names((MeshAxis.WORLD,))
    )
    dense = _unflatten(world, degrees, DENSE_AXES)
    expert = _unflatten(world, degrees, EXPERT_AXES) if degrees.expert_parallel_degree > 1 else None
    flat = {
        axis: dense[axis_names(parts)]._flatten(axis.value) for axis, parts in FLATTENED.items()
    }
    return Meshes(world=world, dense=dense, expert=expert,
                  dp=flat[MeshAxis.DP], replica=flat[MeshAxis.REPLICA])


def _unflatten(
    world: DeviceMesh, degrees: ResolvedDegrees, axes: tuple[MeshAxis, ...]
) -> DeviceMesh:
    shape = mesh_shape(degrees, axes)
    total = 1
    for size in shape:
        total *= size
    if total != degrees.world_size:  # e.g. EP with TP, which the contract refuses
        raise ValueError(
            f"mesh {dict(zip(axis_names(axes), shape, strict=True))} holds {total} ranks, "
            f"not the world size {degrees.world_size}"
        )
    return world._unflatten(0, shape, axis_names(axes))


__all__ = ["Meshes", "build_meshes"]
