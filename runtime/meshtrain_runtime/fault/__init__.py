"""Fault-tolerant replica groups (``torch_distributed.fault_tolerance``, docs/fault-tolerance.md).

When the backend sets ``MESHTRAIN_FT_*`` for a rank, ``init()`` calls `start`: it checks the
group's layout and readies a session for this replica group (its own torchrun world); the
group's torchft Manager starts at its first training step (group_session.py says why; the
module is not named ``session``, which would shadow `session()` once imported), and
``state.dp_rank``/``dp_size`` become the job-wide coordinates (group g's shard rank s reads rows
``g x shard + s`` of ``N x shard``) so a script's data sharding does not change through failures.
``transform()`` calls `attach_model`, ``forward_backward`` calls `note_loss`, the rank entry
calls `finish` when the script returned, ``save_checkpoint`` / ``load_checkpoint`` ask
`writes_checkpoint`, `checkpoint_record` and `resume`. Nothing here imports torchft (or torch)
until a job asks for it, and nothing here imports the rest of the runtime.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import ReplicaGroupEnv, read_replica_group_env

if TYPE_CHECKING:
    import torch
    from torch import nn

    from meshtrain_runtime.fault.group_session import FaultSession

_session: FaultSession | None = None


def start(*, rank: int, world_size: int, degrees: ResolvedDegrees,
          device_type: str) -> ReplicaGroupEnv | None:
    """Ready this rank's replica group, if the job is fault-tolerant: its settings (None
    without ``MESHTRAIN_FT_*``). `rank` and `world_size` are the group's own torchrun world's."""
    global _session
    settings = read_replica_group_env(os.environ)
    if settings is None:
        return None
    _check_group_layout(degrees, settings.replica_groups)
    from meshtrain_runtime.fault.group_session import FaultSession
    from meshtrain_runtime.fault.torchft_parts import check_group_world, import_torchft

    import_torchft()
    check_group_world()
    if _session is None:
        _session = FaultSession(settings, group_rank=rank, group_world_size=world_size,
                                device_type=device_type)
        atexit.register(_session.shutdown)
    return settings


def _check_group_layout(degrees: ResolvedDegrees, replica_groups: int) -> None:
    if degrees.replicate_degree != 1 or degrees.data_parallel_degree != degrees.world_size:
        raise ConfigError(
            f"fault tolerance: this replica group's {degrees.world_size} ranks resolve to "
            f"replicate {degrees.replicate_degree} x shard {degrees.hybrid_shard_degree} x tp "
            f"{degrees.tensor_parallel_degree} x pp {degrees.pipeline_parallel_degree}, but a "
            "replica group must be one sharding group (the replicate dimension spans the "
            f"{replica_groups} groups). Set hybrid_shard_degree={degrees.world_size} and the "
            "other degrees to 1.")
    if degrees.context_parallel_degree > 1 or degrees.expert_parallel_degree > 1:
        raise ConfigError(
            "fault tolerance runs hybrid sharding only in this build: set "
            "context_parallel_degree and expert_parallel_degree to 1.")


def session() -> FaultSession | None:
    """This process's fault-tolerance session (None when the job is not fault-tolerant)."""
    return _session


def attach_model(model: nn.Module) -> None:
    """Hook the transformed `model` into the replica groups' steps (no-op without them)."""
    if _session is not None:
        _session.attach_model(model)


def note_loss(loss: torch.Tensor) -> None:
    """Record this step's loss for the step's JSON line (no-op without replica groups)."""
    if _session is not None:
        _session.note_loss(loss)


def current_step() -> int | None:
    """Steps committed so far (a healed group continues at its peer's count); None when the
    job is not fault-tolerant."""
    return None if _session is None else _session.current_step()


def step_to_run() -> int | None:
    """The number of the step about to run, for choosing its data: starts the step's quorum now
    (a restarted group heals here, so it reads the rows of the job's step, not of its loop's
    first iteration). Call it once per step, before the step's forward; None when the job is not
    fault-tolerant."""
    return None if _session is None else _session.step_to_run()


def track(follower: Any) -> Any:
    """Keep a torch LR scheduler (or GradScaler) in step with the committed steps; returns it.

    ``scheduler = fault.track(torch.optim.lr_scheduler.LambdaLR(optimizer, ...))``: its
    ``step()`` (a scaler's ``update()``) does nothing after an optimizer step that did not
    commit (the optimizer did not move either), and a healing group receives its state from the
    peer with the model's, so a restarted group goes on at the job's learning rate.
    ``meshtrain_runtime.grad_scaler()`` returns a tracked scaler already. Without fault
    tolerance it returns `follower` untouched."""
    if _session is None:
        return follower
    from meshtrain_runtime.fault.follow import follow

    return follow(_session, follower)


@contextlib.contextmanager
def outside_training() -> Iterator[None]:
    """Optimizer steps inside are no training steps: torch's checkpoint helpers step an
    optimizer with zero gradients (and lr 0) to create its state, which must start no quorum
    and commit nothing (save_checkpoint and load_checkpoint run inside this)."""
    if _session is None:
        yield
        return
    _session.outside_training += 1
    try:
        yield
    finally:
        _session.outside_training -= 1


def finish() -> None:
    """The script returned (the rank entry calls this): mark this group finished."""
    if _session is not None:
        _session.finish()


def writes_checkpoint() -> bool:
    """Whether this rank's group writes the current step's checkpoint (True without fault
    tolerance): one group's ranks write each step, the others skip it."""
    return True if _session is None else _session.writes_checkpoint()


def checkpoint_record() -> dict[str, int] | None:
    """What a checkpoint keeps to resume the job's committed steps (None without replica
    groups)."""
    return None if _session is None else _session.checkpoint_record()


def note_checkpoint(kind: str, seconds: float, step: int | None) -> None:
    """A checkpoint was written ("write") or loaded ("load") in `seconds` (kept for the job's
    measured times; no-op without replica groups)."""
    if _session is not None:
        _session.note_checkpoint(kind, seconds, step)


def resume(record: dict[str, int] | None) -> None:
    """A checkpoint with `checkpoint_record`'s values was loaded: this group goes on from its
    committed steps (no-op without replica groups, or for a checkpoint without them)."""
    if _session is not None and record:
        _session.resume(record)


__all__ = ["attach_model", "checkpoint_record", "current_step", "finish", "note_checkpoint",
           "note_loss", "outside_training", "resume", "session", "start", "step_to_run", "track",
           "writes_checkpoint"]
