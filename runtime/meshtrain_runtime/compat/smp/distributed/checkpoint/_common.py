"""Shared argument handling of SMP's save / load wrappers."""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis


def group_coordinator(process_group: dist.ProcessGroup | None, coordinator_rank: int) -> int:
    """SMP passes the coordinator as a global rank; DCP wants its index inside the group."""
    if process_group is None or not dist.is_initialized():
        return coordinator_rank
    ranks = dist.get_process_group_ranks(process_group)
    if coordinator_rank not in ranks:
        raise ConfigError(
            f"coordinator_rank={coordinator_rank} is not in the process group (global ranks "
            f"{ranks}). Use one of them, e.g. min(get_global_ranks(process_group))."
        )
    return ranks.index(coordinator_rank)


def check_local(checkpoint_id: Any, s3_region: Any, s3client_config: Any) -> None:
    """S3 checkpoint ids need SMP's S3 client: refuse with the way out."""
    if (checkpoint_id is not None and "://" in os.fspath(checkpoint_id)) or s3_region or \
            s3client_config:
        raise ConfigError(
            f"checkpoint_id={str(checkpoint_id)!r}: meshtrain's SMP checkpoint API writes to a "
            "local or shared file system. Save under /opt/ml/checkpoints (SM_CHECKPOINT_DIR); "
            "the estimator's checkpoint_s3_uri syncs it to S3."
        )


def per_tp_rank(state_dict: Any, process_group: dist.ProcessGroup | None) -> Any:
    """SMP's sharded layout: one checkpoint per tp rank, written over the FSDP group.

    A DTensor that is also split over the ``tp`` axis spans ranks outside the FSDP group, so
    DCP (saving over that group) would see only part of it. Each such DTensor is re-described
    as this tp rank's part (its shape), sharded over the remaining axes only: the same local
    tensor, so a load into it fills the model in place. Other values pass through.
    """
    if process_group is None or not dist.is_initialized():
        return state_dict
    ranks = set(dist.get_process_group_ranks(process_group))
    return _map_tensors(state_dict, lambda t: _tp_part(t, ranks))


def copy_back(original: Any, loaded: Any) -> None:
    """Put values DCP replaced (ints, bytes, plain objects) back into the caller's dict.

    Tensors were filled in place; everything else DCP assigns into the dict it was given,
    which `per_tp_rank` may have rebuilt.
    """
    if original is loaded:
        return
    if isinstance(original, dict):
        for key, value in loaded.items():
            if isinstance(original.get(key), dict | list):
                copy_back(original[key], value)
            elif not _is_tensor(original.get(key)):
                original[key] = value
    elif isinstance(original, list):
        for index, value in enumerate(loaded):
            if isinstance(original[index], dict | list):
                copy_back(original[index], value)
            elif not _is_tensor(original[index]):
                original[index] = value


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _map_tensors(value: Any, fn: Any) -> Any:
    if isinstance(value, dict):
        return {key: _map_tensors(item, fn) for key, item in value.items()}
    if isinstance(value, list):
        return [_map_tensors(item, fn) for item in value]
    return fn(value)


def _tp_part(value: Any, group_ranks: set[int]) -> Any:
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor):
        return value
    mesh = value.device_mesh
    names = mesh.mesh_dim_names or ()
    if MeshAxis.TP not in names or set(mesh.mesh.flatten().tolist()) <= group_ranks:
        return value
    tp_dim = names.index(MeshAxis.TP)
    shape = list(value.shape)
    placement = value.placements[tp_dim]
    if placement.is_shard():
        dim, tp = placement.dim, mesh.size(tp_dim)
        if shape[dim] % tp:
            raise ConfigError(
                f"a tensor of shape {tuple(shape)} is split unevenly over tp={tp} on dim {dim}: "
                "SMP's per-tp-rank checkpoint needs even splits. Save with "
                "meshtrain_runtime.save_checkpoint instead."
            )
        shape[dim] //= tp
    rest = [n for n in names if n != MeshAxis.TP]
    submesh = mesh[rest[0]] if len(rest) == 1 else mesh[tuple(rest)]
    placements = [p for i, p in enumerate(value.placements) if i != tp_dim]
    local = value.to_local()
    import torch

    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, submesh, placements, run_check=False,
                              shape=torch.Size(shape), stride=stride)
