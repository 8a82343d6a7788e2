"""``torch.sagemaker.distributed.checkpoint.state_dict_loader.load`` on DCP."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.compat.smp.distributed.checkpoint._common import (
    check_local,
    copy_back,
    group_coordinator,
    per_tp_rank,
)
from meshtrain_runtime.torch_api import load_state_dict_impl


def load(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | None = None,
    storage_reader: Any = None,
    planner: Any = None,
    process_group: dist.ProcessGroup | None = None,
    check_keys_matched: bool = True,
    coordinator_rank: int = 0,
    s3_region: str | None = None,
    s3client_config: Any = None,
) -> None:
    """Load a DCP checkpoint into `state_dict` in place (every rank of the group calls it).

    `check_keys_matched`: every key of `state_dict` must be in the checkpoint (else KeyError,
    which AWS's example catches to retry with older key names).
    """
    if storage_reader is None and checkpoint_id is None:
        raise ConfigError("load() needs checkpoint_id= or storage_reader=: nothing to read from.")
    check_local(checkpoint_id, s3_region, s3client_config)
    reader = storage_reader or FileSystemReader(str(checkpoint_id))
    planner = planner or DefaultLoadPlanner(allow_partial_load=not check_keys_matched)
    target = per_tp_rank(state_dict, process_group)  # the same local tensors: filled in place
    load_state_dict_impl(
        target,
        storage_reader=reader,
        process_group=process_group,
        coordinator_rank=group_coordinator(process_group, coordinator_rank),
        planner=planner,
    )
    copy_back(state_dict, target)


__all__ = ["load"]
