"""``torch.sagemaker.distributed.checkpoint.state_dict_saver``: save / async_save on DCP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from meshtrain_runtime.checkpoint.sharded import marker_record, write_marker
from meshtrain_runtime.compat.smp.distributed.checkpoint._common import (
    check_local,
    group_coordinator,
    per_tp_rank,
)
from meshtrain_runtime.compat.smp.distributed.checkpoint.async_utils import AsyncCallsQueue
from meshtrain_runtime.torch_api import save_state_dict_impl

_default_queue: AsyncCallsQueue | None = None


class PyTorchDistSaveShardedStrategy:
    """SMP's default sharded strategy: torch.distributed.checkpoint writing ``.distcp`` files."""

    backend = "torch_dist"

    def writer(self, checkpoint_id: str, storage_writer: Any) -> Any:
        return storage_writer or dcp.FileSystemWriter(checkpoint_id, overwrite=True)


def save(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | None = None,
    storage_writer: Any = None,
    planner: Any = None,
    process_group: dist.ProcessGroup | None = None,
    coordinator_rank: int = 0,
    wait_error_handling: bool = True,
    force_check_all_plans: bool = True,
    s3_region: str | None = None,
    s3client_config: Any = None,
) -> None:
    """Save `state_dict` with DCP over `process_group` (every rank of the group calls it)."""
    check_local(checkpoint_id, s3_region, s3client_config)
    writer = PyTorchDistSaveShardedStrategy().writer(str(checkpoint_id), storage_writer)
    local_coordinator = group_coordinator(process_group, coordinator_rank)
    save_state_dict_impl(
        per_tp_rank(state_dict, process_group),
        storage_writer=writer,
        process_group=process_group,
        coordinator_rank=local_coordinator,
        planner=planner,
    )
    if storage_writer is None and _is_coordinator(process_group, local_coordinator):
        mark_completed(str(checkpoint_id), has_optimizer="optimizer" in state_dict)


def _is_coordinator(process_group: dist.ProcessGroup | None, local_coordinator: int) -> bool:
    if not dist.is_initialized():
        return True
    return dist.get_rank(process_group) == local_coordinator


def mark_completed(directory: str, *, has_optimizer: bool) -> None:
    """Write meshtrain's completion marker, so ``meshtrain_runtime.load_checkpoint`` (and
    ``latest_checkpoint`` on a ``step_<n>`` directory) accept this checkpoint.

    Written after DCP's final gather, i.e. once every rank of the group wrote its files.
    """
    write_marker(Path(directory), marker_record(None, None, has_optimizer))


def async_save(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | None = None,
    storage_writer: Any = None,
    planner: Any = None,
    process_group: dist.ProcessGroup | None = None,
    coordinator_rank: int = 0,
    queue: AsyncCallsQueue | None = None,
    sharded_strategy: PyTorchDistSaveShardedStrategy | None = None,
    wait_error_handling: bool = True,
    force_check_all_plans: bool = True,
    s3_region: str | None = None,
    s3client_config: Any = None,
) -> int:
    """Stage `state_dict` to host memory now and write it in the background (torch's
    ``dcp.async_save``); the save is tracked in `queue`. Returns its call index.

    DCP's coordinator is the group's first rank (async_save has no coordinator argument);
    `coordinator_rank` is still checked to be in the group.
    """
    global _default_queue
    check_local(checkpoint_id, s3_region, s3client_config)
    group_coordinator(process_group, coordinator_rank)
    strategy = sharded_strategy or PyTorchDistSaveShardedStrategy()
    writer = strategy.writer(str(checkpoint_id), storage_writer)
    future = dcp.async_save(
        per_tp_rank(state_dict, process_group),
        storage_writer=writer,
        planner=planner,
        process_group=process_group,
    )
    if queue is None:
        _default_queue = _default_queue or AsyncCallsQueue()
        queue = _default_queue
    return queue.schedule(future)


def maybe_finalize_async_calls(
    blocking: bool = True, process_group: dist.ProcessGroup | None = None
) -> list[int]:
    """Finalise saves started by `async_save` without a queue of their own."""
    if _default_queue is None:
        return []
    return _default_queue.maybe_finalize_async_calls(blocking=blocking, process_group=process_group)


__all__ = [
    "PyTorchDistSaveShardedStrategy",
    "async_save",
    "mark_completed",
    "maybe_finalize_async_calls",
    "save",
]
