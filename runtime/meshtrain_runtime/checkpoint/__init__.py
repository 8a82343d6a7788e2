"""Checkpoints: sharded save/load of model, optimizer, data loader and RNG; resume on any layout;
export.

- ``sharded``: ``save_checkpoint`` / ``load_checkpoint`` / ``latest_checkpoint`` through
  torch.distributed.checkpoint (DCP), the completion marker, pruning, asynchronous saves.
- ``rng``: each rank's random number generator states beside a checkpoint.
- ``full_export``: ``export_full_state_dict``, the whole unsharded model on rank 0 (in a job).
- ``export``: ``export_to_hf``, a saved checkpoint to a Hugging Face folder in one process
  (``python -m meshtrain_runtime.checkpoint.export``, which ``meshtrain export`` runs).
- ``base``: the path rule and rank helpers they share.

``from meshtrain_runtime.checkpoint import save_checkpoint`` (and the other names below) is the
public path; ``export_full_state_dict`` is loaded on first use (torch's full-state-dict
machinery).
"""

from __future__ import annotations

from typing import Any

from meshtrain_runtime.checkpoint.sharded import (
    MARKER_NAME,
    PendingCheckpoint,
    default_checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    marker_record,
    prune_checkpoints,
    save_checkpoint,
    step_dir,
    wait_for_pending_save,
    write_marker,
)

__all__ = [
    "MARKER_NAME",
    "PendingCheckpoint",
    "default_checkpoint_dir",
    "export_full_state_dict",
    "latest_checkpoint",
    "load_checkpoint",
    "marker_record",
    "prune_checkpoints",
    "save_checkpoint",
    "step_dir",
    "wait_for_pending_save",
    "write_marker",
]


def __getattr__(name: str) -> Any:
    if name == "export_full_state_dict":
        from meshtrain_runtime.checkpoint.full_export import export_full_state_dict

        return export_full_state_dict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
