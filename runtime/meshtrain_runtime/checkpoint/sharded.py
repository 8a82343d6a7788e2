"""Sharded checkpoints that resume on another layout, resume helpers, and a full export.

Saving and loading go through torch's own machinery: ``torch.distributed.checkpoint`` (DCP) for
the files and ``torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict`` for the
model and optimizer state. Every rank writes only its own shards (DTensors of FSDP2, HSDP, TP or
EP); DCP records the global shapes, so a checkpoint saved on one layout (hybrid 2x2 on 4 ranks,
tp=2 ...) loads on any other (full shard on 2 ranks, one process ...). Nothing here reshards by
hand.

Layout of a checkpoint root (default ``$SM_CHECKPOINT_DIR``, else /opt/ml/checkpoints)::

    <root>/step_00000002/.metadata, __0_0.distcp, ...   (DCP files)
    <root>/step_00000002/config.json                    (an HF model's config, for export)
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
import shutil
import time
from concurrent.futures import Future
from functools import partial
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
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.paths import DEFAULT_CHECKPOINT_DIR
from meshtrain_runtime import fault
from meshtrain_runtime.checkpoint.base import (
    PathLike,
    barrier,
    check_local_path,
    rank,
    world_size,
)
from meshtrain_runtime.checkpoint.rng import restore_rng_states, save_rng_states
from meshtrain_runtime.parallel.pipeline import PipelineModule

MARKER_NAME = "meshtrain-checkpoint.json"
FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")


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
    async_: bool = False,
    keep_last: int | None = None,
    loader: Any = None,
) -> Path | PendingCheckpoint:
    """Save `model` (and `optimizer`) as a sharded DCP checkpoint; call on every rank.

    - `path`: the checkpoint root; None = `default_checkpoint_dir()`. With `step`, the files go
      to ``<path>/step_<step>`` (what `latest_checkpoint` finds); without it, to `path` itself.
    - `extra`: JSON-serialisable values to get back from `load_checkpoint` (data position,
      scheduler state ...). Stored in the marker with `step`. Each rank's RNG states are saved
      too and restored by a resume on the same world size.
    - `async_`: copy the state to CPU now, write the files in the background (torch DCP's
      ``async_save`` on a process group of its own) and return a :class:`PendingCheckpoint`;
      the marker is written once every rank's files are on disk. A later save first waits for
      an earlier one to finish.
    - `keep_last`: once this save completes, delete all but the newest `keep_last` completed
      ``step_<n>`` directories under `path` (and interrupted ones older than this step).
    - `loader`: a ``meshtrain_runtime.data.loader``; its position (global, the same on every
      rank) is stored in the marker, and ``load_checkpoint(..., loader=...)`` continues from it
      on any layout.

    A model with a Hugging Face ``config`` gets its ``config.json`` beside the files, so that
    ``meshtrain export CHECKPOINT --hf OUT`` (``meshtrain_runtime.checkpoint.export.export_to_hf``)
    needs nothing else. Returns the directory written (sync), or the pending save. Saving again
    into a completed directory first removes its marker, so a crash mid-save never leaves an old
    marker over new, partial files.
    """
    wait_for_pending_save()
    started = time.monotonic()
    target = _resolve_save_dir(path, step)
    if not fault.writes_checkpoint():  # replica groups: another group's ranks write this step
        return target if not async_ else PendingCheckpoint(target, _done(), lambda: None)
    record = marker_record(step, extra, optimizer is not None)
    if loader is not None:
        record["loader"] = loader.state_dict()
    if fault.session() is not None:  # replica groups resume the job's committed steps
        record["fault_tolerance"] = fault.checkpoint_record()
    flat = isinstance(model, PipelineModule)  # see _training_state
    if flat:
        record["flat_optimizer"] = True
    root = None if step is None else target.parent
    _check_keep_last(keep_last, step)
    if rank() == 0:
        target.mkdir(parents=True, exist_ok=True)
        (target / MARKER_NAME).unlink(missing_ok=True)
        _keep_hf_config(model, target)
    barrier()
    save_rng_states(target, rank())
    # overwrite=True said explicitly: re-saving a step replaces it (its marker is gone already)
    writer = dcp.FileSystemWriter(str(target), overwrite=True)
    with fault.outside_training():  # torch may step the optimizer to create its state
        state = _training_state(model, optimizer, flat=flat)
    complete = partial(_complete, target, record, root, keep_last)
    if async_:
        global _pending
        future = dcp.async_save(state, storage_writer=writer, process_group=_async_group())
        _pending = PendingCheckpoint(target, future, complete)
        return _pending
    dcp.save(state, storage_writer=writer)
    barrier()  # every rank's files are on disk before the marker says so
    complete()
    barrier()
    fault.note_checkpoint("write", time.monotonic() - started, step)
    return target


class PendingCheckpoint:
    """An asynchronous save in flight: `wait()` (on every rank) returns its directory."""

    def __init__(self, path: Path, future: Any, complete: Any) -> None:
        self.path = path
        self._future = future
        self._complete = complete
        self._finished = False

    def done(self) -> bool:
        """This rank's files are written (the marker may still be pending on rank 0)."""
        return self._future.done()

    def wait(self) -> Path:
        """Block until every rank's files and the marker are on disk; collective."""
        global _pending
        if not self._finished:
            self._future.result()  # DCP's errors surface here
            barrier()  # every rank's files are on disk: now the marker may say so
            self._complete()
            barrier()
            self._finished = True
        if _pending is self:
            _pending = None
        return self.path


_pending: PendingCheckpoint | None = None
_async_groups: dict[int, dist.ProcessGroup] = {}


def wait_for_pending_save() -> Path | None:
    """Finish the asynchronous save in flight, if any (collective); its directory or None."""
    return _pending.wait() if _pending is not None else None


def _async_group() -> dist.ProcessGroup | None:
    """A gloo group of its own for background saves, so their collectives never interleave
    with the training step's on the default group (one per default group, made on first use)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    key = id(dist.group.WORLD)
    if key not in _async_groups:
        _async_groups[key] = dist.new_group(backend="gloo")
    return _async_groups[key]


def _complete(target: Path, record: dict[str, Any], root: Path | None,
              keep_last: int | None) -> None:
    """Rank 0, after every rank's files are written: the marker, then pruning."""
    if rank() != 0:
        return
    write_marker(target, record)
    if root is not None and keep_last is not None:
        prune_checkpoints(root, keep_last, newest=record["step"])


def prune_checkpoints(root: PathLike, keep_last: int, *, newest: int | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` completed step directories under `root`, and
    interrupted ones older than `newest`; return what was deleted."""
    steps = sorted((int(m.group(1)), child) for child in Path(root).iterdir()
                   if (m := _STEP_DIR.match(child.name)))
    completed = [(n, d) for n, d in steps if (d / MARKER_NAME).is_file()]
    keep = {d for _, d in completed[-keep_last:]}
    doomed = [d for n, d in steps if d not in keep and (
        (d / MARKER_NAME).is_file() or (newest is not None and n < newest))]
    for directory in doomed:
        shutil.rmtree(directory, ignore_errors=True)
    return doomed


def _done() -> Future:
    """A future that is already done: the save of a replica group that does not write."""
    future: Future = Future()
    future.set_result(None)
    return future


def _check_keep_last(keep_last: int | None, step: int | None) -> None:
    if keep_last is None:
        return
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(f"save_checkpoint(keep_last={keep_last!r}): keep_last is the number "
                          "of completed step_<n> directories to keep, an int >= 1.")
    if step is None:
        raise ConfigError("save_checkpoint(keep_last=...) prunes step_<n> directories, so it "
                          "needs step=<the training step>.")


def load_checkpoint(
    path: PathLike | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loader: Any = None,
) -> dict[str, Any]:
    """Load a checkpoint into `model` (and `optimizer`, `loader`) on any layout; every rank.

    `path` is a directory `save_checkpoint` completed, or a root of step directories (the latest
    completed one is loaded); None = `default_checkpoint_dir()`. Transform the model and create
    the optimizer first: the checkpoint fills their (sharded) tensors in place.
    `loader` (a ``meshtrain_runtime.data.loader`` of the same data) continues from the saved
    position, so its next batch is the one the uninterrupted run reads; it is checked first,
    so a changed source, tokenizer or seq_len is a ConfigError before any tensor is read.
    Returns ``{"step": int | None, "extra": dict, "path": str, "rng_restored": bool}``: each
    rank's RNG states come back when the world size is the one that saved. An asynchronous save
    still in flight is finished first.
    """
    wait_for_pending_save()
    started = time.monotonic()
    target, record = _broadcast_from_rank0(_find_loadable, path)
    if isinstance(record, str):  # rank 0 found a problem: every rank raises the same error
        raise ConfigError(record)
    if optimizer is not None and not record["has_optimizer"]:
        raise ConfigError(
            f"{target} was saved without an optimizer, so load_checkpoint(optimizer=...) has no "
            "optimizer state to load. Load the model only (optimizer=None) or save with the "
            "optimizer."
        )
    if loader is not None:
        _restore_loader(loader, target, record)
    flat = bool(record.get("flat_optimizer"))
    with fault.outside_training():  # torch may step the optimizer to create its state
        state = _training_state(model, optimizer, flat=flat)
        dcp.load(state, checkpoint_id=str(target))
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"],
                           options=StateDictOptions(flatten_optimizer_state_dict=flat))
    fault.resume(record.get("fault_tolerance"))  # replica groups go on from its steps
    fault.note_checkpoint("load", time.monotonic() - started, record["step"])
    same_world = record.get("world_size") == world_size()
    restored = same_world and restore_rng_states(target, rank())
    return {"step": record["step"], "extra": record["extra"], "path": str(target),
            "rng_restored": restored}


def latest_checkpoint(directory: PathLike | None = None) -> Path | None:
    """The completed ``step_<n>`` directory with the highest n under `directory`, else None.

    `directory` defaults to `default_checkpoint_dir()`. A missing directory means a fresh start
    (None); directories without the completion marker (an interrupted save) are skipped.
    """
    check_local_path(directory)
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


# --- helpers ---


def _restore_loader(loader: Any, target: Path, record: dict[str, Any]) -> None:
    if "loader" not in record:
        raise ConfigError(
            f"{target} was saved without a loader, so load_checkpoint(loader=...) has no "
            "position to continue from. Save with save_checkpoint(..., loader=loader), or load "
            "without loader= and choose the rows yourself.")
    loader.load_state_dict(record["loader"])


def _keep_hf_config(model: nn.Module, target: Path) -> None:
    """config.json of an HF model beside its checkpoint (the export reads it)."""
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "to_json_file", None)):
        config.to_json_file(str(target / "config.json"))


def _training_state(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    *, flat: bool = False) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...} as torch's sharded state dicts (FQN keys).

    `flat` (pipelined models; the marker says so): the optimizer's param groups keyed by
    parameter name, not as a list whose ``params`` differ per pipeline stage (DCP keeps one
    rank's copy of a list, so the other stages' groups would be lost)."""
    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    return {"model": model_state, "optimizer": optim_state}


def _resolve_save_dir(path: PathLike | None, step: int | None) -> Path:
    check_local_path(path)
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


def write_marker(directory: Path, record: dict[str, Any]) -> None:
    """Say that `directory` is a complete checkpoint (atomically: never half a marker).

    Call once every rank's files are on disk; `record` comes from `marker_record`."""
    _write_atomically(Path(directory) / MARKER_NAME, json.dumps(record, indent=2))


def marker_record(step: int | None, extra: dict[str, Any] | None,
                  has_optimizer: bool) -> dict[str, Any]:
    """What the marker holds: step, extra, whether an optimizer was saved, the world size."""
    if extra is not None and not isinstance(extra, dict):
        raise ConfigError(f"save_checkpoint(extra=...) takes a dict, got {type(extra).__name__}.")
    record = {"format": FORMAT_VERSION, "step": step, "extra": extra or {},
              "has_optimizer": has_optimizer, "world_size": world_size()}
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
        check_local_path(path)
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
    value = [fn(*args) if rank() == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(value, src=0)
    return value[0]


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


__all__ = [
    "MARKER_NAME",
    "PendingCheckpoint",
    "default_checkpoint_dir",
    "latest_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
    "step_dir",
    "wait_for_pending_save",
]

