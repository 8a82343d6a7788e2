"""What the replica groups decide together without a collective between them: who finished the job,
and which group writes a step's checkpoint. Torch-free.

The backend gives every rank a folder all groups share (``MESHTRAIN_FT_COORDINATION_DIR``, the
job's); the markers' layout is the contract's (`meshtrain.contract.fault_tolerance`):

- ``finished-<g>.json``: group g's script returned (its loop ended); rank 0 writes it BEFORE its
  Manager stops heartbeating, so another group can only get a quorum without g after g's marker
  exists (torchft forms no quorum without a group that still heartbeats: with two groups its
  split-brain rule, with more the join timeout, which is the quorum timeout). A group that meets
  a quorum without every group then looks for a marker, and stops if it finds one
  (`ReplicaGroupSuperseded`): no group trains on alone after another finished.
- ``superseded-<g>.json``: group g stopped for that reason; the backend reads it to tell a group
  that finished from one that stopped (both exit 0).

The checkpoint writer of a step is the lowest-numbered group of the step's quorum: every group
knows the quorum, so every group decides the same without asking, and the step's files are
written once (a live group always takes part, so some group writes).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from meshtrain.contract.env import MESHTRAIN_ATTEMPT
from meshtrain.contract.fault_tolerance import FINISHED, SUPERSEDED, read_markers, write_marker


class ReplicaGroupSuperseded(SystemExit):
    """Another replica group finished the job while this one's loop was behind: this group stops
    (exit code 0, the rest of the script skipped) instead of training on alone."""

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message


def checkpoint_writer(participants: list[int]) -> int:
    """The replica group that writes a step's checkpoint: the lowest of the step's quorum
    (group 0 before any quorum)."""
    return min(participants) if participants else 0


def finished_groups(folder: str | None, own: int) -> dict[int, dict[str, Any]]:
    """Groups other than `own` that finished the job (their markers), {} without a folder."""
    if folder is None:
        return {}
    found = read_markers(folder, FINISHED)
    found.pop(own, None)
    return found


def mark_finished(folder: str | None, group: int, committed_steps: int) -> None:
    """Say that `group` finished the job after `committed_steps` steps (its rank 0 calls it)."""
    if folder is not None:
        write_marker(folder, FINISHED, group, {"committed_steps": committed_steps,
                                               "attempt": _attempt(), "time": time.time()})


def mark_superseded(folder: str | None, group: int, finished: dict[int, dict[str, Any]],
                    committed_steps: int) -> str:
    """Record that `group` stops because another finished; the line its rank 0 prints."""
    first = min(finished) if finished else None
    steps = finished.get(first, {}).get("committed_steps") if first is not None else None
    if folder is not None:
        write_marker(folder, SUPERSEDED, group, {"finished_group": first, "attempt": _attempt(),
                                                 "committed_steps": committed_steps,
                                                 "time": time.time()})
    return (f"meshtrain: replica group {group} stops: replica group {first} finished the job "
            f"({steps} steps committed) while this group's loop had not; it does not train on "
            f"alone (this group committed {committed_steps})")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _attempt() -> int | None:
    value = os.environ.get(MESHTRAIN_ATTEMPT, "")
    return int(value) if value.isdigit() else None


__all__ = ["ReplicaGroupSuperseded", "checkpoint_writer", "finished_groups", "mark_finished",
           "mark_superseded", "say"]
