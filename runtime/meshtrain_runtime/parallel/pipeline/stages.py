"""Stage modules and the module that holds one rank's stages under the unsplit model's names.

A stage (`PipelineStageModule`) holds the modules and tensors it runs at their ORIGINAL paths
(``layers.3.mlp.up.weight``) in containers of its own, so FSDP2 can shard each stage as its
own root. The `PipelineModule` holds every stage of this rank at the same paths too, so
``state_dict()`` / ``named_parameters()`` of any layout use the unsplit model's names (DCP
checkpoints move between layouts) and ``.parameters()`` is what the optimizer takes. Stages and
the `PipelineModule` share the module objects, so what later steps of ``transform`` do to a
block (checkpointing, compile, FSDP2 per stage) is seen through both; tensors a stage reads by
attribute (``self.pos.weight[:t]``) live in the stage's own containers, and
`PipelineModule.refresh_tensors` re-reads them once FSDP2 has replaced them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from meshtrain.contract.errors import ConfigError

V_SCHEDULES = ("ZBVZeroBubble",)


class PipelineStageModule(nn.Module):
    """One stage: its modules at their original paths, and the forward that runs them."""

    def __init__(self, index: int, num_stages: int, block_paths: list[str]) -> None:
        super().__init__()
        self.stage_index, self.num_stages = index, num_stages
        object.__setattr__(self, "block_paths", block_paths)  # its blocks, in order
        object.__setattr__(self, "leaves", [])  # (original path, module) it holds
        object.__setattr__(self, "tensors", [])  # (original path, persistent) of tensors it reads

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def stage_blocks(self) -> list[nn.Module]:
        """This stage's blocks in forward order (the units of FSDP and checkpointing)."""
        return [self.get_submodule(path) for path in self.block_paths]

    def hold_module(self, path: str, module: nn.Module) -> None:
        """Register `module` at its original `path` under this stage."""
        self.leaves.append((path, module))
        attach(self, path, module)

    def hold_tensor(self, path: str, tensor: torch.Tensor, *, persistent: bool = True) -> None:
        """Register a parameter or buffer the stage reads by attribute at its original path."""
        self.tensors.append((path, persistent))
        attach_tensor(self, path, tensor, persistent=persistent)


class PipelineModule(nn.Module):
    """This rank's stages under the original parameter names; run it with forward_backward."""

    def __init__(self, stages: list[PipelineStageModule], params: Any) -> None:
        super().__init__()
        object.__setattr__(self, "stage_modules", stages)
        object.__setattr__(self, "pipeline_params", params)
        object.__setattr__(self, "runner", None)  # meshtrain_runtime.step builds it lazily
        for stage in stages:  # fresh containers: the stages' own trees stay as they are
            for path, module in stage.leaves:
                if not _holds(self, path, module):
                    attach(self, path, module)
        self.refresh_tensors()

    def local_blocks(self) -> list[nn.Module]:
        return [block for stage in self.stage_modules for block in stage.stage_blocks()]

    def refresh_tensors(self) -> None:
        """Hold the stages' attribute-read tensors as they are now (after FSDP2 swapped them)."""
        for stage in self.stage_modules:
            for path, persistent in stage.tensors:
                owner_path, _, name = path.rpartition(".")
                tensor = getattr(stage.get_submodule(owner_path), name)
                attach_tensor(self, path, tensor, persistent=persistent)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            "This model is split into pipeline stages (pipeline_parallel_degree="
            f"{self.pipeline_params.pipeline_parallel_degree}): a stage cannot run the whole "
            "forward. Train with loss = meshtrain_runtime.forward_backward(model, inputs, "
            "targets, loss_fn=fn), which runs the pipeline schedule.")


def stage_bounds(num_blocks: int, num_stages: int, split_points: list[int] | None) -> list[int]:
    """Block index bounds of every stage: stage s holds blocks[bounds[s]:bounds[s + 1]]."""
    if num_blocks < num_stages:
        raise ConfigError(
            f"The model has {num_blocks} blocks but the pipeline needs {num_stages} stages "
            "(pipeline_parallel_degree x pipeline_stages_per_rank), at least one block each. "
            f"Use at most {num_blocks} stages.")
    if split_points is not None:
        if split_points[-1] >= num_blocks:
            raise ConfigError(
                f"pipeline_split_points={split_points}: the model has {num_blocks} blocks "
                f"(indices 0-{num_blocks - 1}), so the last stage would be empty. Use split "
                f"points below {num_blocks}.")
        return [0, *split_points, num_blocks]
    base, extra = divmod(num_blocks, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return bounds


def local_stage_indices(pp_rank: int, pp: int, per_rank: int, schedule: str) -> list[int]:
    """The stages rank `pp_rank` holds: looped (s, s + pp, ...) or a V (ZBVZeroBubble)."""
    if schedule in V_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]


def stage_ranks(pp: int, per_rank: int, schedule: str) -> dict[int, int]:
    """Which pipeline rank holds each stage."""
    return {stage: rank for rank in range(pp)
            for stage in local_stage_indices(rank, pp, per_rank, schedule)}


def attach(root: nn.Module, path: str, module: nn.Module) -> None:
    """Register `module` at dotted `path` under `root`, creating plain containers on the way."""
    parent, _, leaf = path.rpartition(".")
    _container(root, parent).add_module(leaf, module)


def attach_tensor(root: nn.Module, path: str, tensor: torch.Tensor, *, persistent: bool) -> None:
    """Register a parameter (or buffer) at dotted `path` under `root`."""
    parent, _, leaf = path.rpartition(".")
    owner = _container(root, parent)
    if isinstance(tensor, nn.Parameter):
        owner.register_parameter(leaf, tensor)
    else:
        owner.register_buffer(leaf, tensor, persistent=persistent)


def _container(root: nn.Module, path: str) -> nn.Module:
    node = root
    for name in path.split(".") if path else ():
        child = getattr(node, name, None)
        if not isinstance(child, nn.Module):
            child = nn.Module()
            node.add_module(name, child)
        node = child
    return node


def _holds(root: nn.Module, path: str, module: nn.Module) -> bool:
    try:
        return root.get_submodule(path) is module
    except AttributeError:
        return False


__all__ = ["PipelineModule", "PipelineStageModule", "attach", "attach_tensor",
           "local_stage_indices", "stage_bounds", "stage_ranks"]
