"""Gradient-norm clipping that is correct for DTensor gradients on any mesh.

``torch.nn.utils.clip_grad_norm_`` stacks per-tensor norms, which fails when gradients live on
different meshes (FSDP mesh, expert mesh, TP mesh) or mix DTensors with plain tensors. Here the
gradients are grouped by (mesh, placements); each group's norm is computed by torch and made
whole with ``full_tensor()`` (a reduction over the sharded axes only: replicas are not counted
twice); the group norms are then combined and torch's ``clip_grads_with_norm_`` scales each
group (expert weights on the expert mesh, the rest on the data-parallel or (shard, tp) mesh).
With pipelining the stages' norms are combined over the ``pp`` group: the norm of the whole model.

`grad_scaler()` hands out the loss scaler ``mixed_precision: fp16`` needs (see docs/hsdp.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshtrain_runtime import fault
from meshtrain_runtime import state as runtime_state


def clip_grad_norm_(
    model_or_parameters: nn.Module | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    *,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """Clip gradients in place to total `norm_type`-norm `max_norm`; return the total norm.

    Accepts a model or its parameters, like ``torch.nn.utils.clip_grad_norm_``. The norm is the
    one a single process holding the whole model would compute.
    """
    parameters = (
        list(model_or_parameters.parameters())
        if isinstance(model_or_parameters, nn.Module)
        else list(model_or_parameters)
    )
    with_grads = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in with_grads]
    total_norm = _over_pipeline_stages(
        total_grad_norm(grads, norm_type, error_if_nonfinite=error_if_nonfinite), norm_type)
    # One scaling call per layout: a foreach op refuses DTensors on different meshes.
    for group in _group_by_layout(with_grads, layout_of=lambda p: p.grad):
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total_norm, foreach=foreach)
    return total_norm


def grad_scaler(
    *,
    enabled: bool | None = None,
    init_scale: float = 2.0**16,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    growth_interval: int = 2000,
) -> torch.amp.GradScaler:
    """torch's dynamic loss scaler for this runtime's device; enabled when it is needed.

    fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero in the half-precision
    backward (FSDP2 reduces them in fp32, but only after they were computed in fp16). Scaling
    the loss by `init_scale` keeps them representable; the scaler unscales before the step,
    skips steps whose gradients overflowed and adapts the scale. By default it is enabled only
    when ``mixed_precision`` is ``"fp16"`` (bf16 has fp32's exponent range and needs none): a
    disabled scaler passes everything through, so one training loop serves every precision::

        scaler = mr.grad_scaler()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)          # before clipping: clip the true gradients
        mr.clip_grad_norm_(model, 1.0)
        scaler.step(optimizer)              # skipped if any rank saw inf/nan
        scaler.update()

    Sharded DTensor gradients (FSDP2, TP, EP meshes) work as they are: DTensor all-reduces the
    scaler's found-inf flag over each gradient's mesh, so every rank skips the same steps.
    """
    st = runtime_state.current()
    if enabled is None:
        enabled = st.config.mixed_precision == "fp16"
    return fault.track(torch.amp.GradScaler(  # replica groups: moves with committed steps only
        st.device.type,
        init_scale=init_scale,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
        enabled=enabled,
    ))


def total_grad_norm(
    grads: list[torch.Tensor], norm_type: float = 2.0, *, error_if_nonfinite: bool = False
) -> torch.Tensor:
    """The `norm_type`-norm of all `grads` together, as a plain (replicated) tensor."""
    norm_type = float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    group_norms = [
        _whole(torch.nn.utils.get_total_norm(group, norm_type, error_if_nonfinite=False))
        for group in _group_by_layout(grads)
    ]
    device = group_norms[0].device
    stacked = torch.stack([n.to(device) for n in group_norms])
    if math.isinf(norm_type):
        total = stacked.max()
    else:
        total = stacked.pow(norm_type).sum().pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"The total norm of order {norm_type} of the gradients is non-finite, so it cannot "
            "be clipped. Set error_if_nonfinite=False to clip anyway."
        )
    return total


def _group_by_layout(
    tensors: list[torch.Tensor],
    layout_of: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> list[list[torch.Tensor]]:
    """Group by the layout of ``layout_of(t)`` in first-seen order (identical on every rank, so
    collectives line up)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        grad = layout_of(tensor)
        if isinstance(grad, DTensor):
            key = ("dtensor", grad.device_mesh, tuple(grad.placements))
        else:
            key = ("local", grad.device)
        groups.setdefault(key, []).append(tensor)
    return list(groups.values())


def _over_pipeline_stages(norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    """With pipelining each rank holds its stages' gradients: combine the stages' norms over
    the ``pp`` group (every rank of a pipeline clips its own stages)."""
    if not runtime_state.is_initialized() or runtime_state.current().pp_size == 1:
        return norm
    group = runtime_state.current().pp_process_group
    if math.isinf(float(norm_type)):
        total = norm.clone()
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        return total
    total = norm.double().pow(norm_type)
    dist.all_reduce(total, group=group)
    return total.pow(1.0 / norm_type).to(norm.dtype)


def _whole(norm: torch.Tensor) -> torch.Tensor:
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


__all__ = ["clip_grad_norm_", "grad_scaler", "total_grad_norm"]
