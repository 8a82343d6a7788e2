"""Translate a resolved plan into torch ``parallelize_module`` styles (Megatron's layout).

Without sequence parallelism the residual stream is a plain tensor, whole on every tp rank:

    x -> [region input: Replicate DTensor] -> colwise q/k/v (local heads) -> attention
      -> rowwise o_proj (all-reduce) -> x + attn          (same for gate/up -> down)

With it, the residual stream is a DTensor split on the sequence dim (``Shard(1)``); norms run
on the split tokens (``SequenceParallel``), each region's input is all-gathered once, and each
rowwise output is reduce-scattered back to ``Shard(1)``. Activations are batch-first
``[batch, seq, hidden]``, as in Hugging Face models.

Every region gets one ``PrepareRegionInput``: its input becomes ONE Replicate DTensor shared by
q, k and v (gate and up), so the backward pass sums their input gradients locally and reduces
them once: Megatron's two all-reduces per layer, not one per projection.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
)

from meshtrain_runtime.parallel.plans.expand import is_inside
from meshtrain_runtime.parallel.plans.regions import is_norm
from meshtrain_runtime.parallel.plans.resolve import ResolvedPlan, StyleSpec

SEQUENCE_DIM = 1


class PrepareRegionInput(ParallelStyle):
    """Turn a region's hidden-state input into one Replicate DTensor (Megatron's ``f``).

    Torch's ``PrepareModuleInput`` needs to know whether the input comes positionally or by
    keyword; HF calls attention with ``hidden_states=`` and MLPs positionally, so this style
    takes the first positional argument, else the keyword named like ``forward``'s first
    parameter. `input_layout` is how a plain tensor input is laid out (Replicate, or
    ``Shard(1)`` under sequence parallelism).
    """

    def __init__(self, *, input_layout: Placement) -> None:
        super().__init__()
        self.input_layout = input_layout

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        keyword = _first_forward_parameter(module)

        def to_replicate(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if not isinstance(value, DTensor):
                value = DTensor.from_local(value, device_mesh, (self.input_layout,),
                                           run_check=False)
            if value.placements != (Replicate(),):
                value = value.redistribute(device_mesh, (Replicate(),))
            return value

        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                return (to_replicate(args[0]), *args[1:]), kwargs
            if keyword in kwargs:
                return args, {**kwargs, keyword: to_replicate(kwargs[keyword])}
            return args, kwargs

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module

    def __repr__(self) -> str:
        return f"{type(self).__name__}(input_layout={self.input_layout})"


def _first_forward_parameter(module: nn.Module) -> str:
    parameters = list(inspect.signature(module.forward).parameters)
    return parameters[0] if parameters else "hidden_states"


def torch_style(
    style: StyleSpec, *, sequence_parallel: bool, loss_parallel: bool
) -> ParallelStyle | None:
    """The torch style for one canonical style name (None: the module stays whole)."""
    if isinstance(style, ParallelStyle):
        return style
    stream: Placement = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel(output_layouts=stream, use_local_output=not sequence_parallel)
    if style == "embedding_rowwise":
        return RowwiseParallel(
            input_layouts=Replicate(),
            output_layouts=stream,
            use_local_output=not sequence_parallel,
        )
    if style == "colwise_gather_output":
        return ColwiseParallel(
            input_layouts=stream,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    if style == "sequence_parallel":
        return SequenceParallel(sequence_dim=SEQUENCE_DIM) if sequence_parallel else None
    if style == "replicate":
        return None
    raise AssertionError(f"unresolved style {style!r}")  # resolve_tp_plan canonicalises


def sequence_parallel_norms(model: nn.Module, resolved: ResolvedPlan) -> list[str]:
    """Norms on the residual stream: outside every region and not styled by the plan, or
    inside one but on its whole input (a plain block's norm before its colwise projection)."""
    return [
        name
        for name, module in model.named_modules()
        if name
        and is_norm(module)
        and (
            name in resolved.whole_inputs
            or (name not in resolved.styles
                and not any(is_inside(name, region) for region in resolved.regions))
        )
    ]


def build_parallelize_plan(
    model: nn.Module,
    resolved: ResolvedPlan,
    *,
    sequence_parallel: bool,
    loss_parallel: bool,
) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan: module styles, region inputs and (with SP) norms."""
    plan: dict[str, ParallelStyle] = {}
    for name, style in resolved.styles.items():
        translated = torch_style(
            style, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel
        )
        if translated is not None:
            plan[name] = translated
    layout: Placement = Shard(SEQUENCE_DIM) if sequence_parallel else Replicate()
    entered = {region for region in resolved.regions
               if any(is_inside(name, region) for name in resolved.whole_inputs)}
    for region in resolved.regions:
        # A region whose own modules read its input whole (its norm) keeps a plain input;
        # each colwise projection then turns its input into a Replicate DTensor itself.
        if region not in entered:
            plan.setdefault(region, PrepareRegionInput(input_layout=layout))
    if sequence_parallel:
        for name in sequence_parallel_norms(model, resolved):
            plan[name] = SequenceParallel(sequence_dim=SEQUENCE_DIM)
    return plan
