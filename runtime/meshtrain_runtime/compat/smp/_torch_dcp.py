"""The torch checkpoint functions as SMP v2's images ship them (installed with the alias).

SMP's containers carry a patched torch, and AWS's public SMP v2 scripts call torch's own
distributed-checkpoint functions with SMP's conventions:

- ``torch.distributed.checkpoint.save_state_dict`` / ``load_state_dict(..., process_group=pg,
  coordinator_rank=r)`` with `r` a **global** rank (``min(get_global_ranks(pg))``); stock torch
  reads it as a rank inside `pg`, which fails for every group that does not hold global rank
  `r`'s index. Here a coordinator that is a member of `pg` is mapped to its index in `pg`
  (a value that is not a member keeps torch's meaning).
- The FSDP1 ``SHARDED_STATE_DICT`` of a tensor-parallel model is written per tp rank (one
  folder per tp rank, saved over the FSDP group): DTensors also split over ``tp`` are written as
  this tp rank's part (``per_tp_rank``), and loaded back in place.
- ``torch.distributed.checkpoint.optimizer.load_sharded_optimizer_state_dict(...,
  process_group=pg)``: stock torch has no `process_group` and lays the optimizer state out as
  ShardedTensors over the whole world. For a model state dict of DTensors (FSDP1 with a device
  mesh, as SMP's flow builds it) each optimizer tensor is loaded into a DTensor laid out like
  its parameter, which ``FSDP.optim_state_dict_to_load`` takes as it takes its own output.

`install()` swaps these module attributes (so names a script imports afterwards see them) and
`remove()` restores torch's; nothing happens on import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.optimizer as dcp_optimizer
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.distributed.tensor import DTensor

from meshtrain_runtime.compat.smp.distributed.checkpoint._common import copy_back, per_tp_rank
from meshtrain_runtime.torch_api import unflatten_state_dict

_original: dict[str, Callable[..., Any]] = {}


def smp_coordinator(process_group: dist.ProcessGroup | None, coordinator_rank: int) -> int:
    """SMP's global coordinator rank as DCP's index in `process_group` (non-members unchanged)."""
    if process_group is None or not dist.is_initialized():
        return coordinator_rank
    ranks = dist.get_process_group_ranks(process_group)
    return ranks.index(coordinator_rank) if coordinator_rank in ranks else coordinator_rank


def save_state_dict(state_dict: dict[str, Any], storage_writer: Any,
                    process_group: dist.ProcessGroup | None = None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner: Any = None) -> Any:
    """torch's ``save_state_dict`` with SMP's global coordinator and per-tp-rank layout."""
    return _original["save_state_dict"](
        per_tp_rank(state_dict, process_group), storage_writer, process_group,
        smp_coordinator(process_group, coordinator_rank), no_dist, planner,
    )


def load_state_dict(state_dict: dict[str, Any], storage_reader: Any,
                    process_group: dist.ProcessGroup | None = None, coordinator_rank: int = 0,
                    no_dist: bool = False, planner: Any = None) -> None:
    """torch's ``load_state_dict`` (in place) with SMP's coordinator and per-tp-rank layout."""
    target = per_tp_rank(state_dict, process_group)  # the same local tensors: filled in place
    _original["load_state_dict"](
        target, storage_reader, process_group,
        smp_coordinator(process_group, coordinator_rank), no_dist, planner,
    )
    copy_back(state_dict, target)


def load_sharded_optimizer_state_dict(model_state_dict: dict[str, Any], optimizer_key: str,
                                      storage_reader: Any, planner: Any = None,
                                      process_group: dist.ProcessGroup | None = None) -> Any:
    """Optimizer state laid out like the model's DTensor parameters, read over `process_group`.

    A model state dict without DTensors (FSDP1 on a process group: ShardedTensors) goes to
    torch's own function, which has no `process_group`.
    """
    if not any(isinstance(v, DTensor) for v in model_state_dict.values()):
        return _original["load_sharded_optimizer_state_dict"](
            model_state_dict, optimizer_key, storage_reader, planner
        )
    metadata = storage_reader.read_metadata()
    flat: dict[str, Any] = {}
    for key, value in metadata.state_dict_metadata.items():
        path = metadata.planner_data[key]
        if path[0] != optimizer_key:
            continue
        if isinstance(value, BytesStorageMetadata):
            flat[key] = "<bytes_io>"
            continue
        like = model_state_dict.get(path[2]) if len(path) > 3 and path[1] == "state" else None
        if isinstance(like, DTensor) and value.size.numel() > 1:
            flat[key] = torch.zeros_like(like, dtype=value.properties.dtype)
        else:
            flat[key] = torch.zeros(value.size, dtype=value.properties.dtype)
    load_state_dict(flat, storage_reader, process_group,
                    min(dist.get_process_group_ranks(process_group)) if process_group else 0,
                    planner=planner)
    return unflatten_state_dict(flat, {k: metadata.planner_data[k] for k in flat})


_PATCHES = {
    "save_state_dict": (dcp, save_state_dict),
    "load_state_dict": (dcp, load_state_dict),
    "load_sharded_optimizer_state_dict": (dcp_optimizer, load_sharded_optimizer_state_dict),
}


def install() -> None:
    """Swap in SMP's conventions (idempotent)."""
    for name, (module, replacement) in _PATCHES.items():
        if name not in _original:
            _original[name] = getattr(module, name)
            setattr(module, name, replacement)


def remove() -> None:
    """Give torch its own functions back."""
    for name, (module, _) in _PATCHES.items():
        if name in _original:
            setattr(module, name, _original.pop(name))


__all__ = [
    "install",
    "load_sharded_optimizer_state_dict",
    "load_state_dict",
    "remove",
    "save_state_dict",
    "smp_coordinator",
]
