"""Sharded checkpoints that resume on another layout, resume helpers, and a full export.

Saving and loading go through torch's own machinery: ``torch.distributed.checkpoint`` (DCP) for
the files and ``torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict`` for the
model and optimizer state. Every rank writes only its own shards (DTensors of FSDP2, HSDP, TP or
EP); DCP records the global shapes, so a checkpoint saved on one layout (hybrid 2x2 on 4 ranks,
tp=2 ...) loads on any other (full shard on 2 ranks, one process ...). Nothing here reshards by
hand.

Layout of a checkpoint root (default ``$SM_CHECKPOINT_DIR``, else /opt/ml/checkpoints)::

    <root>/step_00000002/.metadata, __0_0.distcp, ...   (DCP files)
    <root>/step_00000002/meshtrain-checkpoint.json      (written last: the save completed)

Only a directory with the marker counts: rank 0 writes it after every rank finished writing
(DCP's final gather plus a barrier), through a temporary file and ``os.replace``. A save that
was interrupted leaves no marker and `latest_checkpoint` skips it.

All ranks must see the same directory (a shared file system): DCP's files are written by every
rank and read by every rank on load.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from meshtrain.contract.env import SM_CHECKPOINT_DIR
from meshtrain.contract.paths import DEFAULT_CHECKPOINT_DIR
from meshtrain.errors import ConfigError

MARKER_NAME = "meshtrain-checkpoint.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")

PathLike = str | os.PathLike


def default_checkpoint_dir() -> Path:
    """``$SM_CHECKPOINT_DIR`` (exported by the bootstrap), else /opt/ml/checkpoints."""
    return Path(os.environ.get(SM_CHECKPOINT_DIR) or DEFAULT_CHECKPOINT_DIR)


def step_dir(root: PathLike, step: int) -> Path:
    """The directory of step `step` under `root` (zero-padded, so names sort by step)."""
    return Path(root) / f"step_{step:08d}"


def save_checkpoint(
    path: PathLike | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    step: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save `model` (and `optimizer`) as a sharded DCP checkpoint; call on every rank.

    - `path`: the checkpoint root; None = `default_checkpoint_dir()`. With `step`, the files go
      to ``<path>/step_<step>`` (what `latest_checkpoint` finds); without it, to `path` itself.
    - `extra`: JSON-serialisable values to get back from `load_checkpoint` (data position,
      scheduler state ...). Stored in the marker with `step`.

    Returns the directory written. Saving again into a completed directory first removes its
    marker, so a crash mid-save never leaves an old marker over new, partial files.
    """
    target = _resolve_save_dir(path, step)
    record = _marker_record(step, extra, optimizer is not None)
    if _rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
        (target / MARKER_NAME).unlink(missing_ok=True)
    _barrier()
    # overwrite=True said explicitly: re-saving a step replaces it (its marker is gone already)
    writer = dcp.FileSystemWriter(str(target), overwrite=True)
    dcp.save(_training_state(model, optimizer), storage_writer=writer)
    _barrier()  # every rank's files are on disk before the marker says so
    if _rank() == 0:
        _write_atomically(target / MARKER_NAME, json.dumps(record, indent=2))
    _barrier()
    return target


def load_checkpoint(
    path: PathLike | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into `model` (and `optimizer`) on any layout; call on every rank.

    `path` is a directory `save_checkpoint` completed, or a root of step directories (the latest
    completed one is loaded); None = `default_checkpoint_dir()`. Transform the model and create
    the optimizer first: the checkpoint fills their (sharded) tensors in place.
    Returns ``{"step": int | None, "extra": dict, "path": str}``.
    """
    target, record = _broadcast_from_rank0(_find_loadable, path)
    if isinstance(record, str):  # rank 0 found a problem: every rank raises the same error
        raise ConfigError(record)
    if optimizer is not None and not record["has_optimizer"]:
        raise ConfigError(
            f"{target} was saved without an optimizer, so load_checkpoint(optimizer=...) has no "
            "optimizer state to load. Load the model only (optimizer=None) or save with the "
            "optimizer."
        )
    state = _training_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(target))
    if optimizer is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    return {"step": record["step"], "extra": record["extra"], "path": str(target)}


def latest_checkpoint(directory: PathLike | None = None) -> Path | None:
    """The completed ``step_<n>`` directory with the highest n under `directory`, else None.

    `directory` defaults to `default_checkpoint_dir()`. A missing directory means a fresh start
    (None); directories without the completion marker (an interrupted save) are skipped.
    """
    _check_local(directory)
    root = default_checkpoint_dir() if directory is None else Path(directory)
    if not root.exists():
        return None
    if not root.is_dir():
        raise ConfigError(f"latest_checkpoint({str(root)!r}): that is a file, not a directory of "
                          "step_<n> checkpoints. Pass the checkpoint root directory.")
    steps = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / MARKER_NAME).is_file():
            steps.append((int(match.group(1)), child))
    return max(steps)[1] if steps else None


def export_full_state_dict(model: nn.Module, path: PathLike) -> Path | None:
    """Write the full, unsharded model state dict on rank 0 for serving; call on every rank.

    The keys are the model's own (for a Hugging Face model its HF names, so
    ``from_pretrained`` reads it). `path` is a file, or a directory (then ``model.safetensors``
    or ``pytorch_model.bin`` inside, plus the HF ``config.json`` when the model has one).
    Uses safetensors when it is installed, else ``torch.save``. Returns the file on rank 0,
    None on the other ranks.
    """
    _check_local(path)
    target = Path(path)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)  # collective: gathers to rank 0
    written = None
    if _rank() == 0:
        written = _write_full(full, target, getattr(model, "config", None))
    _barrier()
    return written


# --- helpers ---


def _training_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...} as torch's sharded state dicts (FQN keys)."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def _resolve_save_dir(path: PathLike | None, step: int | None) -> Path:
    _check_local(path)
    root = default_checkpoint_dir() if path is None else Path(path)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(f"save_checkpoint(step={step!r}): step must be an int >= 0 (the "
                          "training step, used to name step_<n> directories).")
    target = root if step is None else step_dir(root, step)
    for candidate in (root, target):
        if candidate.exists() and not candidate.is_dir():
            raise ConfigError(f"save_checkpoint: {str(candidate)!r} is a file; a checkpoint is "
                              "a directory. Pass a directory path (it is created if missing).")
    return target


def _marker_record(step: int | None, extra: dict[str, Any] | None,
                   has_optimizer: bool) -> dict[str, Any]:
    if extra is not None and not isinstance(extra, dict):
        raise ConfigError(f"save_checkpoint(extra=...) takes a dict, got {type(extra).__name__}.")
    record = {"format": FORMAT_VERSION, "step": step, "extra": extra or {},
              "has_optimizer": has_optimizer, "world_size": _world_size()}
    try:
        json.dumps(record)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"save_checkpoint(extra=...) must be JSON-serialisable ({error}). Convert tensors "
            "with .tolist() / .item(), or keep them in the model or optimizer state."
        ) from None
    return record


def _find_loadable(path: PathLike | None) -> tuple[Path, dict[str, Any] | str]:
    """(directory, marker record) or (path, error message); runs on rank 0 only."""
    root = default_checkpoint_dir() if path is None else Path(path)
    try:
        _check_local(path)
        if (root / MARKER_NAME).is_file():
            return root, json.loads((root / MARKER_NAME).read_text())
        latest = latest_checkpoint(root)
    except ConfigError as error:
        return root, str(error)
    if latest is not None:
        return latest, json.loads((latest / MARKER_NAME).read_text())
    if not root.exists():
        return root, (f"load_checkpoint({str(root)!r}): no such directory. Pass a directory "
                      "written by save_checkpoint (or its root of step_<n> directories).")
    return root, (f"load_checkpoint({str(root)!r}): no completed checkpoint there (no "
                  f"{MARKER_NAME}, which save_checkpoint writes last, and no step_<n> directory "
                  "with one). An interrupted save is never loaded; pass another checkpoint.")


def _broadcast_from_rank0(fn: Any, *args: Any) -> Any:
    value = [fn(*args) if _rank() == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(value, src=0)
    return value[0]


def _write_full(state: dict[str, torch.Tensor], target: Path, config: Any) -> Path:
    if target.is_dir() or not target.suffix:
        target.mkdir(parents=True, exist_ok=True)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(target)
        target = target / ("model.safetensors" if _has_safetensors() else "pytorch_model.bin")
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors = _unshared(state)
    if target.suffix == ".safetensors":
        if not _has_safetensors():
            raise ConfigError(f"{target} asks for safetensors, which is not installed: "
                              "`pip install safetensors` or use a .bin / .pt file name.")
        from safetensors.torch import save_file

        save_file(tensors, str(target), metadata={"format": "pt"})
    else:
        torch.save(tensors, target)
    return target


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, tied weights copied apart (safetensors refuses shared storage)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def _has_safetensors() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True


def _check_local(path: PathLike | None) -> None:
    if path is not None and "://" in os.fspath(path):
        raise ConfigError(
            f"{str(path)!r}: checkpoints are written to a local or shared file system path. On "
            "SageMaker write to /opt/ml/checkpoints (SM_CHECKPOINT_DIR); checkpoint_s3_uri syncs "
            "it to S3."
        )


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


__all__ = [
    "MARKER_NAME",
    "default_checkpoint_dir",
    "export_full_state_dict",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
    "step_dir",
]
