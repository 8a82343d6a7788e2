"""The state a healing replica group receives: this rank's local shards, as plain tensors.

A peer's FSDP2 parameters and optimizer state are DTensors over ITS group's mesh; torchft's HTTP
transport carries plain tensors, and the receiving rank (same shard coordinate, same shapes) copies
them into its own DTensors' local shards, so the healed state is bitwise the peer's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def _local(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def model_shards(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's local shard of every parameter and buffer of `model`, by name."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {name: _local(tensor) for name, tensor in named}


@torch.no_grad()
def load_model_shards(model: nn.Module, shards: dict[str, torch.Tensor]) -> None:
    """Copy a peer's local shards (same shard coordinate) into `model`'s, in place."""
    named = dict(model.named_parameters()) | dict(model.named_buffers())
    missing = sorted(set(named) - set(shards))
    if missing:
        raise RuntimeError(f"fault tolerance: the peer's state lacks {missing[:5]}: the replica "
                           "groups run different models")
    for name, tensor in named.items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        local.copy_(shards[name])


def optimizer_shards(optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    """`optimizer`'s state dict with every DTensor replaced by its local shard (None: no
    optimizer has stepped on this rank yet, so there is no state to send)."""
    if optimizer is None:
        return None
    state_dict = optimizer.state_dict()
    state = {key: {name: _local(value) for name, value in entry.items()}
             for key, entry in state_dict["state"].items()}
    return {"state": state, "param_groups": state_dict["param_groups"]}


def load_optimizer_shards(optimizer: torch.optim.Optimizer, shards: dict[str, Any]) -> None:
    """Load a peer's `optimizer_shards` into `optimizer`: local shards become DTensors laid out
    as this rank's parameters (state that is not per-element, e.g. Adam's step, stays as is)."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    state = {}
    for key, entry in shards["state"].items():
        param = params[int(key)]
        state[key] = {name: _like(value, param) for name, value in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": shards["param_groups"]})


def _like(value: Any, param: torch.Tensor) -> Any:
    if not (isinstance(param, DTensor) and isinstance(value, torch.Tensor)):
        return value
    if value.shape != param.to_local().shape:
        return value
    return DTensor.from_local(value, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


__all__ = ["load_model_shards", "load_optimizer_shards", "model_shards", "optimizer_shards"]
