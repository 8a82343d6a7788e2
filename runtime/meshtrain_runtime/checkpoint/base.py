"""What sharded checkpoints (sharded.py) and the full export (full_export.py) share: the
rule for where checkpoints may be written, and rank/world-size/barrier helpers that also work in
a process without a process group."""

from __future__ import annotations

import os

import torch.distributed as dist

from meshtrain.contract.errors import ConfigError

PathLike = str | os.PathLike


def check_local_path(path: PathLike | None) -> None:
    """Refuse a URI: checkpoints go to a local or shared file system path."""
    if path is not None and "://" in os.fspath(path):
        raise ConfigError(
            f"{str(path)!r}: checkpoints are written to a local or shared file system path. On "
            "SageMaker write to /opt/ml/checkpoints (SM_CHECKPOINT_DIR); checkpoint_s3_uri syncs "
            "it to S3."
        )


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
