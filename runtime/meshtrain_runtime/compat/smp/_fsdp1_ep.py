"""FSDP1 (the script's ``FullyShardedDataParallel``) with expert parallelism, as in SMP's flow.

SMP's sharded checkpoints keep one folder per ``ep`` rank, written over ``model.process_group``:
so, as with tensor parallelism, FSDP1's group excludes the ``ep`` axis. It is the expert
data-parallel group of the runtime's expert mesh (``replicate x shard_mod_ep``: the ranks holding
the same experts). There:

- the experts' DTensors (``Shard(0)`` over ``ep``) become plain parameters holding this rank's
  experts, which FSDP1 can flatten; each `ExpertParallelExperts` is its own FSDP1 unit;
- FSDP1 averages every gradient over its group (``edp`` ranks). The exact gradient is the mean
  over all ``dp = edp * ep`` ranks, so after FSDP1's end-of-backward work the dense gradients
  are summed over the ``ep`` group and divided by ``ep`` (each ep rank had other tokens), and the
  experts' gradients are divided by ``ep`` only (each already sums the tokens of its whole EP
  group through the all-to-all);
- `clip_grad_norm_` counts dense shards once per FSDP1 group and experts once per EP group.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.tensor import DTensor

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.parallel.expert import ExpertParallelExperts, expert_parallel_modules
from meshtrain_runtime.torch_api import (
    CustomWrapPolicy,
    fsdp1_handle,
    fsdp1_syncs_gradients,
    queue_backward_callback,
    tree_flatten,
    wrap_policy_module_classes,
)


def uses_ep(st: runtime_state.RuntimeState) -> bool:
    """Expert parallelism is on (FSDP1 then runs over the expert data-parallel group)."""
    return st.expert_parallel_degree > 1


def localise_experts(module: nn.Module) -> None:
    """Replace the experts' DTensor parameters by plain ones holding this rank's experts."""
    for experts in expert_parallel_modules(module):
        for name, param in list(experts._parameters.items()):
            if isinstance(param, DTensor):
                local = param.to_local().detach()
                experts._parameters[name] = nn.Parameter(local, requires_grad=param.requires_grad)


def _is_experts(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    return recurse or isinstance(module, ExpertParallelExperts)


def with_expert_units(policy: Any) -> Any:
    """The script's auto-wrap policy plus one FSDP1 unit per `ExpertParallelExperts`."""
    if policy is None:
        return ModuleWrapPolicy({ExpertParallelExperts})
    if isinstance(policy, ModuleWrapPolicy):
        return ModuleWrapPolicy(wrap_policy_module_classes(policy) | {ExpertParallelExperts})
    if isinstance(policy, CustomWrapPolicy):  # its own units: experts might share a dense one
        raise ConfigError(
            f"FSDP1 with expert parallelism puts each MoE layer's experts in their own FSDP1 "
            f"unit (their gradients are reduced differently from the dense ones), which "
            f"auto_wrap_policy={type(policy).__name__}(...) cannot be extended to do. Pass a "
            f"callable policy (functools.partial(transformer_auto_wrap_policy, ...)), a "
            f"ModuleWrapPolicy, or none."
        )

    def combined(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        own = policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel)
        return own or _is_experts(module, recurse, nonwrapped_numel)

    return combined


def _flat_grads(root: nn.Module) -> list[tuple[FullyShardedDataParallel, torch.Tensor]]:
    units = []
    for unit in FullyShardedDataParallel.fsdp_modules(root):
        handle = fsdp1_handle(unit)
        if handle is not None and handle.flat_param.grad is not None:
            units.append((unit, handle.flat_param.grad))
    return units


@torch.no_grad()
def finish_gradients(root: nn.Module, ep_group: dist.ProcessGroup, ep: int) -> None:
    """After FSDP1's reduction over its group: the mean over every data-parallel rank."""
    for unit, grad in _flat_grads(root):
        if not isinstance(unit.module, ExpertParallelExperts):
            dist.all_reduce(grad, group=ep_group)
        grad.div_(ep)


def install_gradient_finish(root: FullyShardedDataParallel, st: runtime_state.RuntimeState) -> None:
    """Queue `finish_gradients` after FSDP1's end-of-backward callback, once per backward.

    FSDP1's root queues its callback from hooks on its forward outputs; a forward hook on the
    root registers ours on the same outputs afterwards, so ours is queued (and runs) second.
    """
    queued = [False]
    finish = functools.partial(finish_gradients, root, st.ep_process_group,
                               st.expert_parallel_degree)

    def run() -> None:
        queued[0] = False
        if fsdp1_syncs_gradients(root):  # not inside no_sync(): FSDP1 reduced
            finish()

    def on_grad(grad: torch.Tensor) -> torch.Tensor:
        if not queued[0]:
            queued[0] = True
            queue_backward_callback(run)
        return grad

    def after_forward(_module: nn.Module, _args: Any, output: Any) -> None:
        for tensor in tree_flatten(output)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                tensor.register_hook(on_grad)

    root.register_forward_hook(after_forward)


def _norm_parts(units: list[tuple[FullyShardedDataParallel, torch.Tensor]],
                norm_type: float) -> torch.Tensor:
    """(dense, experts) sums of |g|^p (or maxima for p = inf) over this rank's grad shards."""
    parts = torch.zeros(2, dtype=torch.float32)
    for unit, grad in units:
        idx = 1 if isinstance(unit.module, ExpertParallelExperts) else 0
        if math.isinf(norm_type):
            parts[idx] = torch.maximum(parts[idx], grad.detach().abs().max().float().cpu())
        else:
            parts[idx] += grad.detach().float().norm(norm_type).cpu() ** norm_type
    return parts


@torch.no_grad()
def clip_grad_norm_(root: FullyShardedDataParallel, ep_group: dist.ProcessGroup, max_norm: float,
                    norm_type: float) -> torch.Tensor:
    """Clip to `max_norm` by the norm over every gradient, each counted once; return the norm."""
    units = _flat_grads(root)
    parts = _norm_parts(units, norm_type)
    op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
    if root.sharding_strategy != ShardingStrategy.NO_SHARD:  # shards of one copy: combine them
        dist.all_reduce(parts, op=op, group=root.process_group)
    experts = parts[1:].clone()
    dist.all_reduce(experts, op=op, group=ep_group)  # each ep rank holds other experts
    if math.isinf(norm_type):
        total = torch.maximum(parts[0], experts[0])
    else:
        total = (parts[0] + experts[0]) ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for _unit, grad in units:
        grad.mul_(coef.to(grad.device, grad.dtype))
    return total


__all__ = [
    "clip_grad_norm_",
    "finish_gradients",
    "install_gradient_finish",
    "localise_experts",
    "uses_ep",
    "with_expert_units",
]
