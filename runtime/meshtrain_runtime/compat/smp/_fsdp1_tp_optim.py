"""FSDP1's sharded optimizer state for a tensor-parallel model, as SMP's checkpoints hold it.

torch's ``FSDP.optim_state_dict`` / ``optim_state_dict_to_load`` do not round-trip the Adam
moments of parameters that tensor parallelism splits (FSDP1 + DTensor TP: states of row-wise
and column-wise split weights come back changed), so SMP's flow replaces both for FSDP1 models
with tensor parallelism while ``tsm.init`` is in force:

- ``optim_state_dict``: for every original parameter (``use_orig_params=True``), each tensor
  state is gathered over the FSDP group into this tp rank's whole tensor (the parameter's
  tp-local shape) and returned as a DTensor on FSDP's mesh, ``Shard(0)``: exactly what SMP
  writes into its per-tp-rank checkpoint folder. Scalar states (``step``) stay tensors.
- ``optim_state_dict_to_load``: the reverse (also from the parameter-shaped DTensors the
  optimizer loader allocates): each state is gathered whole and this rank's flat piece is cut
  out, keyed as ``optimizer.load_state_dict`` expects.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor, Shard

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.compat.smp.distributed.checkpoint._common import _tp_part
from meshtrain_runtime.parallel.collectives import all_gather_into
from meshtrain_runtime.torch_api import (
    clean_tensor_name,
    flat_param_layout,
    fsdp1_handle,
    fsdp1_uses_orig_params,
)


class _Param:
    """Where one original parameter sits in its flat parameter."""

    def __init__(self, flat: Any, index: int, start: int) -> None:
        self.flat, self.index, self.start = flat, index, start
        layout = flat_param_layout(flat)
        self.shape = layout.shapes[index]
        self.numel = layout.numels[index]
        self.info = layout.shard_param_infos[index]


def _params(model: FullyShardedDataParallel) -> dict[int, _Param]:
    """id(original parameter) -> its place, for every FSDP-managed parameter."""
    found: dict[int, _Param] = {}
    for module in FullyShardedDataParallel.fsdp_modules(model):
        handle = fsdp1_handle(module)
        if handle is None:
            continue
        flat = handle.flat_param
        if not fsdp1_uses_orig_params(handle):
            raise ConfigError(
                "FSDP(..., use_orig_params=False) with tensor parallelism: SMP's optimizer "
                "checkpoints need use_orig_params=True (AWS's scripts set it with "
                "use_smp_implementation=1)."
            )
        start, real, layout = 0, 0, flat_param_layout(flat)
        for numel, padding in zip(layout.numels_with_padding, layout.is_padding_mask,
                                  strict=True):
            if not padding:
                found[id(layout.params[real])] = _Param(flat, real, start)
                real += 1
            start += numel
    return found


def _names(model: nn.Module) -> dict[int, str]:
    return {id(p): clean_tensor_name(n) for n, p in model.named_parameters()}


def _gathered(model: FullyShardedDataParallel, optim: torch.optim.Optimizer, flat: Any,
              name: str) -> torch.Tensor:
    """State `name` of every parameter of `flat`, unsharded: gathered over the FSDP group."""
    local = torch.zeros(flat.numel(), dtype=torch.float32, device=flat.device)
    layout = flat_param_layout(flat)
    for index, param in enumerate(layout.params):
        state = optim.state.get(param, {})
        info = layout.shard_param_infos[index]
        if name in state and info.in_shard and info.numel_in_shard:
            local[info.offset_in_shard:info.offset_in_shard + info.numel_in_shard] = \
                state[name].reshape(-1).float()
    group = model.process_group
    gathered = torch.empty(local.numel() * dist.get_world_size(group), dtype=local.dtype,
                           device=local.device)
    all_gather_into(gathered, local, group=group)
    return gathered


def optim_state_dict(model: FullyShardedDataParallel, optim: torch.optim.Optimizer,
                     mesh: Any) -> dict[str, Any]:
    """{"state": {fqn: {name: DTensor | tensor}}, "param_groups": [... "params": [fqn]]}."""
    places, names = _params(model), _names(model)
    params = [p for group in optim.param_groups for p in group["params"]]
    tensor_states = sorted({k for p in params for k, v in optim.state.get(p, {}).items()
                            if torch.is_tensor(v) and v.dim() > 0})
    scalars = {names[id(p)]: {k: v for k, v in optim.state.get(p, {}).items()
                              if not (torch.is_tensor(v) and v.dim() > 0)} for p in params}
    everyone: list[Any] = [None] * dist.get_world_size(model.process_group)
    dist.all_gather_object(everyone, scalars, group=model.process_group)
    state: dict[str, Any] = {}
    cache: dict[tuple[int, str], torch.Tensor] = {}
    for p in params:  # same order on every rank: the collectives line up
        fqn, place = names[id(p)], places[id(p)]
        entry = {k: v for seen in everyone for k, v in seen.get(fqn, {}).items()}
        for name in tensor_states:
            key = (id(place.flat), name)
            if key not in cache:
                cache[key] = _gathered(model, optim, place.flat, name)
            whole = cache[key][place.start:place.start + place.numel].reshape(place.shape)
            chunks = whole.chunk(mesh.size(), dim=0)
            rank = mesh.get_local_rank()
            local = chunks[rank] if rank < len(chunks) else whole[:0]
            entry[name] = DTensor.from_local(local.contiguous(), mesh, [Shard(0)],
                                             run_check=False, shape=whole.shape,
                                             stride=whole.stride())
        state[fqn] = entry
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [names[id(p)] for p in g["params"]]} for g in optim.param_groups]
    return {"state": state, "param_groups": groups}


def optim_state_dict_to_load(model: FullyShardedDataParallel, optim: torch.optim.Optimizer,
                             osd: dict[str, Any]) -> dict[str, Any]:
    """The optimizer's own state dict (integer ids) from `optim_state_dict`'s format."""
    places, names = _params(model), _names(model)
    ranks = set(dist.get_process_group_ranks(model.process_group))
    params = [p for group in optim.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for index, p in enumerate(params):
        saved = osd["state"].get(names[id(p)], {})
        info = places[id(p)].info
        entry: dict[str, Any] = {}
        for name, value in sorted(saved.items()):
            if isinstance(value, DTensor):
                whole = _tp_part(value, ranks).full_tensor().reshape(-1)
                start = info.intra_param_start_idx or 0
                stop = (info.intra_param_end_idx + 1) if info.in_shard else start
                value = whole[start:stop].clone() if info.in_shard else whole[:0].clone()
            entry[name] = value
        if entry:
            state[index] = entry
    ids = iter(range(len(params)))
    saved_groups = osd.get("param_groups") or optim.state_dict()["param_groups"]
    groups = [{**{k: v for k, v in saved.items() if k != "params"},
               "params": [next(ids) for _ in g["params"]]}
              for saved, g in zip(saved_groups, optim.param_groups, strict=True)]
    return {"state": state, "param_groups": groups}


__all__ = ["optim_state_dict", "optim_state_dict_to_load"]
