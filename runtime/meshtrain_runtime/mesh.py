"""The one device mesh of a job, built once from the resolved degrees (torchtitan's ParallelDims).

``build_meshes`` creates ONE DeviceMesh over every rank (the 1-D ``world`` axis) and unflattens it
into the layout of ``meshtrain.contract.mesh_axes``, outermost first ``pp x replicate x shard x
tp``; the sharding axis is split again for context parallelism (``shard_mod_cp x cp``) and, with
EP, for expert parallelism (``shard_mod_ep x ep``). Every other mesh is a view of it: a slice
(``dense`` = one stage's ``replicate x shard x tp``, ``dense[TP]``, ``context[CP]``) or a
flattened axis (``dp``, ``replica``). Axis names come from `MeshAxis`, never from literals.

This is the only module that constructs DeviceMeshes (tests/test_mesh_ownership.py). The one
exception to "a view" is `root_over_groups`: FSDP1 (SMP compat) reads a mesh's root as its whole
layout, so it gets a root DeviceMesh over the SAME process groups as a view, built here.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshtrain.contract import ResolvedDegrees
from meshtrain.contract.mesh_axes import (
    CONTEXT_AXES,
    DENSE_AXES,
    EXPERT_AXES,
    FLATTENED,
    LAYOUT_AXES,
    SHARD_SPLITS,
    MeshAxis,
    axis_names,
    mesh_shape,
)
from meshtrain_runtime.torch_api import flatten_mesh, unflatten_mesh


@dataclass(frozen=True)
class Meshes:
    """The world mesh and the views of it that the stages get."""

    world: DeviceMesh
    """1-D, every rank in global order (axis ``world``)."""
    layout: DeviceMesh
    """``pp x replicate x shard x tp``: the world unflattened (every rank's coordinates)."""
    dense: DeviceMesh
    """This stage's ``replicate x shard x tp``: what FSDP/HSDP and TP slice (``state.mesh``)."""
    context: DeviceMesh
    """This stage's ``replicate x shard_mod_cp x cp x tp``: cp carved out of shard, innermost."""
    expert: DeviceMesh | None
    """This stage's ``replicate x shard_mod_ep x ep`` with EP (ep folded over shard x tp with
    TP), else None (``state.expert_mesh``)."""
    dp: DeviceMesh
    """1-D flattened ``replicate x shard``: the ranks gradients are reduced over (cp included)."""
    replica: DeviceMesh
    """1-D flattened ``shard x tp``: the ranks of this rank's replica (of this stage)."""

    def coordinate(self, axis: MeshAxis) -> int:
        """This rank's index along `axis` (0 along an expert axis without expert parallelism)."""
        if axis in FLATTENED:
            return self.submesh(axis).get_local_rank()
        if axis is MeshAxis.WORLD:
            return self.world.get_local_rank()
        if axis in SHARD_SPLITS[MeshAxis.EP] and self.expert is None:
            # without EP: shard_mod_ep is the whole sharding group and ep has size 1
            return self.coordinate(MeshAxis.SHARD) if axis is MeshAxis.SHARD_MOD_EP else 0
        return self._holder(axis).get_local_rank(axis.value)

    def submesh(self, *axes: MeshAxis) -> DeviceMesh:
        """The view of `axes` (all within one layout, or one flattened axis) holding this rank."""
        if len(axes) == 1 and axes[0] in FLATTENED:
            return self.dp if axes[0] is MeshAxis.DP else self.replica
        if len(axes) == 1 and axes[0] is MeshAxis.WORLD:
            return self.world
        for mesh in self._layouts():
            if all(axis.value in mesh.mesh_dim_names for axis in axes):
                return mesh[axis_names(axes)]
        raise ValueError(f"no mesh holds the axes {axis_names(axes)} in this job")

    def _layouts(self) -> tuple[DeviceMesh, ...]:
        return (self.dense, self.layout, self.context) + (
            (self.expert,) if self.expert is not None else ()
        )

    def _holder(self, axis: MeshAxis) -> DeviceMesh:
        return next(m for m in self._layouts() if axis.value in m.mesh_dim_names)


def build_meshes(degrees: ResolvedDegrees, device_type: str) -> Meshes:
    """Build the world mesh and its views (collective: every rank calls it, in the same order)."""
    world = init_device_mesh(
        device_type, (degrees.world_size,), mesh_dim_names=axis_names((MeshAxis.WORLD,))
    )
    layout = unflatten_mesh(world, MeshAxis.WORLD.value, mesh_shape(degrees, LAYOUT_AXES),
                            axis_names(LAYOUT_AXES))
    dense = layout[axis_names(DENSE_AXES)]
    context = _split_shard(layout, degrees, MeshAxis.CP)[axis_names(CONTEXT_AXES)]
    expert = None
    if degrees.expert_parallel_degree > 1 and degrees.tensor_parallel_degree > 1:
        expert = _fold_over_shard_and_tp(world, degrees)
    elif degrees.expert_parallel_degree > 1:
        expert = _split_shard(layout, degrees, MeshAxis.EP)[axis_names(EXPERT_AXES)]
    flat = {
        axis: flatten_mesh(dense[axis_names(parts)], axis.value)
        for axis, parts in FLATTENED.items()
    }
    return Meshes(world=world, layout=layout, dense=dense, context=context, expert=expert,
                  dp=flat[MeshAxis.DP], replica=flat[MeshAxis.REPLICA])


def _split_shard(layout: DeviceMesh, degrees: ResolvedDegrees, carved: MeshAxis) -> DeviceMesh:
    """`layout` with its ``shard`` axis split into (shard_mod_X, X), X innermost."""
    parts = SHARD_SPLITS[carved]
    return unflatten_mesh(layout, MeshAxis.SHARD.value, mesh_shape(degrees, parts),
                          axis_names(parts))


def _fold_over_shard_and_tp(world: DeviceMesh, degrees: ResolvedDegrees) -> DeviceMesh:
    """EP with TP: ``shard x tp`` (contiguous, tp innermost) re-split as ``shard_mod_ep x ep``.

    A view of the world mesh like the others (unflattened from it), so FSDP sees one root.
    """
    axes = (MeshAxis.PP, *EXPERT_AXES)
    folded = unflatten_mesh(world, MeshAxis.WORLD.value, mesh_shape(degrees, axes),
                            axis_names(axes))
    return folded[axis_names(EXPERT_AXES)]


def root_over_groups(view: DeviceMesh) -> DeviceMesh:
    """A root DeviceMesh with the ranks, dim names and process groups of `view` (no new group).

    For torch APIs that take a mesh's root for its whole layout: FSDP1 turns on its
    tensor-parallel extension when ``device_mesh`` is not its own root, and that extension needs
    the root to be the 2-D (data-parallel, tp) mesh. ``DeviceMesh.from_group`` (public) wraps
    the view's existing groups, so collectives run on the world mesh's groups.
    """
    groups = [view.get_group(dim) for dim in range(view.ndim)]
    if view.ndim == 1:
        return DeviceMesh.from_group(groups[0], view.device_type,
                                     mesh_dim_names=view.mesh_dim_names)
    return DeviceMesh.from_group(groups, view.device_type, mesh=view.mesh,
                                 mesh_dim_names=view.mesh_dim_names)


__all__ = ["Meshes", "build_meshes", "root_over_groups"]
