"""Fault-tolerant replica groups (``torch_distributed.fault_tolerance``, docs/fault-tolerance.md).

When the backend sets ``MESHTRAIN_FT_*`` for a rank, ``init()`` calls `start`: a torchft Manager
for this replica group (its own torchrun world), and ``state.dp_rank``/``dp_size`` become the
job-wide coordinates (group g's shard rank s reads rows ``g x shard + s`` of ``N x shard``) so a
script's data sharding does not change through failures. ``transform()`` calls `attach_model`,
``forward_backward`` calls `note_loss`. Nothing here imports torchft until a job asks for it.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from typing import TYPE_CHECKING

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import read_replica_group_env

if TYPE_CHECKING:
    import torch
    from torch import nn

    from meshtrain_runtime.fault.session import FaultSession
    from meshtrain_runtime.state import RuntimeState

_session: FaultSession | None = None


def start(state: RuntimeState) -> RuntimeState:
    """Join this rank's replica group to the job's quorum, if the job is fault-tolerant.

    Returns `state` with the replica group recorded (unchanged without ``MESHTRAIN_FT_*``).
    """
    global _session
    settings = read_replica_group_env(os.environ)
    if settings is None:
        return state
    _check_group_layout(state, settings.replica_groups)
    from meshtrain_runtime.fault.session import FaultSession
    from meshtrain_runtime.fault.torchft_parts import build_manager

    if _session is None:
        manager, process_group = build_manager(
            settings, group_rank=state.rank, group_world_size=state.world_size,
            device_type=state.device.type)
        _session = FaultSession(settings, manager, process_group, group_rank=state.rank,
                                group_world_size=state.world_size)
        atexit.register(_session.shutdown)
    return dataclasses.replace(state, replica_group=settings.replica_group,
                               replica_groups=settings.replica_groups)


def _check_group_layout(state: RuntimeState, replica_groups: int) -> None:
    degrees = state.degrees
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
    return None if _session is None else int(_session.manager.current_step())


def step_to_run() -> int | None:
    """The number of the step about to run, for choosing its data: starts the step's quorum now
    (a restarted group heals here, so it reads the rows of the job's step, not of its loop's
    first iteration). Call it once per step, before the step's forward; None when the job is not
    fault-tolerant."""
    return None if _session is None else _session.step_to_run()


__all__ = ["attach_model", "current_step", "note_loss", "session", "start", "step_to_run"]
