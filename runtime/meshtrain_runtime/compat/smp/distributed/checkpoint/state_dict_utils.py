"""``torch.sagemaker.distributed.checkpoint.state_dict_utils``: SMP's local state dict.

``SM_LOCAL_STATE_DICT`` is each rank's own shard, saved by replication group and resumed on
the same shard degree (SMP's rule; the replica count may change). For an FSDP1 model it is the
flat parameter shards themselves (``flat_param.<i>`` for the i-th FSDP unit), so DCP loads write
straight into the model. (FSDP1's own ``LOCAL_STATE_DICT`` refuses models wrapped with a device
mesh, which is how SMP's group reaches FSDP here.) For an FSDP2 / DTensor model it is torch's
sharded state dict (DTensors, which DCP also reshards). Use it with the optimizer's own
``state_dict()``: `init_optim_state` creates the
optimizer's state tensors first so a load can fill them in place.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.torch_api import fsdp1_handle


class SMStateDictType(enum.Enum):
    SM_LOCAL_STATE_DICT = enum.auto()


@contextlib.contextmanager
def sm_state_dict_type(model: nn.Module, state_dict_type: SMStateDictType) -> Iterator[None]:
    """Within the block ``model.state_dict()`` returns SMP's local (per-rank) state dict."""
    if state_dict_type is not SMStateDictType.SM_LOCAL_STATE_DICT:
        raise ConfigError(
            f"sm_state_dict_type({state_dict_type!r}): only SMStateDictType.SM_LOCAL_STATE_DICT "
            "exists; for sharded or full state dicts use FSDP.state_dict_type."
        )
    if not isinstance(model, FullyShardedDataParallel):
        yield  # FSDP2 / DTensor modules already return their local shards as DTensors
        return
    # Scoped to the block: model.state_dict() / load_state_dict() read and write the shards.
    model.state_dict = functools.partial(_local_state_dict, model)
    model.load_state_dict = functools.partial(_load_local_state_dict, model)
    try:
        yield
    finally:
        del model.state_dict, model.load_state_dict


def _local_state_dict(model: nn.Module, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:
    units = FullyShardedDataParallel.fsdp_modules(model)
    handles = [fsdp1_handle(unit) for unit in units]
    return {f"flat_param.{index}": handle.flat_param.detach()
            for index, handle in enumerate(handles) if handle is not None}


def _load_local_state_dict(model: nn.Module, state: dict[str, torch.Tensor],
                           *args: object, **kwargs: object) -> None:
    own = _local_state_dict(model)
    if set(own) != set(state):
        raise ConfigError(
            f"SM_LOCAL state dict has {len(state)} FSDP units, the model {len(own)}: a local "
            "checkpoint resumes only on the same model and shard degree."
        )
    with torch.no_grad():
        for key, tensor in own.items():
            if tensor.data_ptr() != state[key].data_ptr():
                tensor.copy_(state[key])


def init_optim_state(optimizer: torch.optim.Optimizer, skip_empty_param: bool = True) -> None:
    """Create the optimizer's state (zeros, step 0) without changing any parameter.

    Runs one ``step()`` with zero gradients and learning rate 0 on parameters that have no state
    yet (empty FSDP shards are skipped when `skip_empty_param`), then restores everything.
    """
    saved = [(g, g.get("lr"), g.get("weight_decay")) for g in optimizer.param_groups]
    grads = {}
    for group in optimizer.param_groups:
        group["lr"] = 0.0
        if "weight_decay" in group:
            group["weight_decay"] = 0.0
        for param in group["params"]:
            if param in optimizer.state or (skip_empty_param and param.numel() == 0):
                continue
            grads[param] = param.grad
            param.grad = torch.zeros_like(param)
    try:
        optimizer.step()
    finally:
        for param, grad in grads.items():
            param.grad = grad
        for group, lr, weight_decay in saved:
            group["lr"] = lr
            if weight_decay is not None:
                group["weight_decay"] = weight_decay


__all__ = ["SMStateDictType", "init_optim_state", "sm_state_dict_type"]
