"""Fault-tolerant replica groups: the ``torch_distributed.fault_tolerance`` option and its checks.

``{"torch_distributed": {"enabled": True, "fault_tolerance": {"replica_groups": N}}}`` with SMP's
``hybrid_shard_degree``: the hosts of one replica of the HSDP replicate dimension form a replica
group that may fail alone. Each group is its own torchrun world (shard axis only); gradients are
averaged across the LIVE groups through torchft (docs/fault-tolerance.md). This module holds the
pydantic model, the platform check, how the lighthouse is run and the environment a rank reads;
the layout check, which needs the resolved degrees, is fault_tolerance_checks.py.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError

TORCHFT_REQUIREMENT = "torchft==0.2.0"
"""What ``pip install 'meshtrain[ft]'`` installs (Linux x86_64 wheels only)."""
SUPPORTED_PLATFORM = ("linux", "x86_64")
MIN_REPLICA_GROUPS_ENV = "MESHTRAIN_FT_MIN_REPLICA_GROUPS"
QUORUM_TIMEOUT_ENV = "MESHTRAIN_FT_QUORUM_TIMEOUT_SECONDS"
RECORDS_FOLDER = "fault_tolerance"
"""``<output data dir>/fault_tolerance/replica-<g>.jsonl``: one JSON line per step per group."""
DEFAULT_REPLICA_GROUP_RESTARTS = 3
"""``max_restarts`` of a fault-tolerant job that does not set it, per replica group. A restart
costs only the failed group's time (the others keep stepping), so a budget is there to end a
crash loop, not to save the job's time: a group that fails a fourth time is more likely broken
(a bad host, a bug that only a restarted group meets) than unlucky, and is left out instead of
restarting until max_run. Long jobs at scale expect more failures per group: set max_restarts
to what ``meshtrain plan --goodput`` expects."""
LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS = 2000
"""How long the lighthouse waits for a heartbeat (torchft's default: 5000 ms). With two groups,
torchft forms no quorum of the survivor alone while the dead group still counts as alive (its
split-brain rule), so this is most of a survivor's pause after a failure: 2 s (heartbeats come
every 100 ms from a thread of their own) keeps that pause, failed step included, under 5 s."""


def lighthouse_join_timeout_ms(ft: FaultTolerance) -> int:
    """How long a quorum waits for a group that heartbeats but has not asked for this step's
    quorum: as long as a quorum may take. A group heartbeats only from its first step on
    (meshtrain_runtime.fault starts its Manager there), so a group that heartbeats without
    asking is in a step, or has just finished the job; the others wait for it rather than step
    on alone (torchft's default, 60 s, is the same figure)."""
    return ft.quorum_timeout_seconds * 1000


def lighthouse_arguments(ft: FaultTolerance) -> list[str]:
    """torchft lighthouse arguments of a job (every backend runs it so), its address aside."""
    return ["--min_replicas", str(ft.min_replica_groups),
            "--join_timeout_ms", str(lighthouse_join_timeout_ms(ft)),
            "--heartbeat_timeout_ms", str(LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS)]


class FaultTolerance(BaseModel):
    """``torch_distributed.fault_tolerance`` (a meshtrain extension)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    replica_groups: int = Field(ge=2)
    """Replica groups (each one replica of the replicate dimension): divides instance_count."""
    min_replica_groups: int = Field(1, ge=1)
    """A step commits only when at least this many groups took part (torchft's
    ``min_replica_size``)."""
    quorum_timeout_seconds: int = Field(60, ge=1)
    """How long a group waits for a quorum (and, at the start, for every group to join)."""

    @model_validator(mode="after")
    def _check_minimum(self) -> FaultTolerance:
        if self.min_replica_groups > self.replica_groups:
            raise ValueError(
                f"min_replica_groups={self.min_replica_groups} > replica_groups="
                f"{self.replica_groups}: no step could ever commit. Use min_replica_groups "
                f"between 1 and {self.replica_groups}")
        return self


def check_fault_tolerance_platform(system: str, machine: str, *, where: str) -> None:
    """torchft ships Linux x86_64 wheels only: refuse a target that cannot install it."""
    if (system.lower(), machine.lower()) != SUPPORTED_PLATFORM:
        raise ConfigError(
            f"torch_distributed.fault_tolerance needs torchft ({TORCHFT_REQUIREMENT}), which is "
            f"published for Linux x86_64 only, but {where} is {system} {machine}. Run the job "
            "on Linux x86_64 hosts, or remove fault_tolerance (max_restarts restarts every host "
            "from the last checkpoint instead).")


def rank_environment(ft: FaultTolerance) -> dict[str, str]:
    """The optional settings a backend passes to every rank beside the replica group's three
    ``MESHTRAIN_FT_*`` variables (defaults apply where they are absent)."""
    return {MIN_REPLICA_GROUPS_ENV: str(ft.min_replica_groups),
            QUORUM_TIMEOUT_ENV: str(ft.quorum_timeout_seconds)}


@dataclass(frozen=True)
class ReplicaGroupEnv:
    """What a rank of a fault-tolerant job reads from its environment."""

    replica_group: int
    replica_groups: int
    lighthouse: str
    min_replica_groups: int = 1
    quorum_timeout_seconds: int = 60
    coordination_dir: str | None = None
    """A folder every group's ranks share (MESHTRAIN_FT_COORDINATION_DIR), None where the
    backend has none (Kubernetes): finish markers and the checkpoint writer need it."""


def read_replica_group_env(environ: Mapping[str, str]) -> ReplicaGroupEnv | None:
    """The rank's replica group settings, or None when the job is not fault-tolerant."""
    keys = (names.MESHTRAIN_FT_REPLICA_GROUP, names.MESHTRAIN_FT_REPLICA_GROUPS,
            names.MESHTRAIN_FT_LIGHTHOUSE)
    present = [key for key in keys if environ.get(key)]
    if not present:
        return None
    if len(present) != len(keys):
        missing = sorted(set(keys) - set(present))
        raise ConfigError(f"fault tolerance: {', '.join(present)} set but {', '.join(missing)} "
                          "missing; the backend sets all three for every rank.")
    try:
        values = [int(environ[key]) for key in keys[:2]] + [
            int(environ.get(MIN_REPLICA_GROUPS_ENV, "1")),
            int(environ.get(QUORUM_TIMEOUT_ENV, "60"))]
    except ValueError as error:
        raise ConfigError(f"fault tolerance: a MESHTRAIN_FT_* variable is not an int: {error}"
                          ) from None
    group, count, minimum, timeout = values
    if not 0 <= group < count:
        raise ConfigError(f"fault tolerance: MESHTRAIN_FT_REPLICA_GROUP={group} is not in "
                          f"0..{count - 1} (MESHTRAIN_FT_REPLICA_GROUPS={count}).")
    return ReplicaGroupEnv(group, count, environ[keys[2]], minimum, timeout,
                           environ.get(names.MESHTRAIN_FT_COORDINATION_DIR) or None)


FINISHED = "finished"
"""Marker kind: the group's script returned; its ranks had committed ``committed_steps``."""
SUPERSEDED = "superseded"
"""Marker kind: the group stopped itself because another group finished the job first."""


def marker_path(folder: str | os.PathLike, kind: str, group: int) -> Path:
    """``<coordination dir>/<kind>-<g>.json``: one replica group's marker (the runtime writes
    it, the backend reads it)."""
    return Path(folder) / f"{kind}-{group}.json"


def write_marker(folder: str | os.PathLike, kind: str, group: int,
                 payload: dict[str, Any]) -> None:
    """Write one group's marker whole (a reader never sees half of it)."""
    path = marker_path(folder, kind, group)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_text(json.dumps({"replica_group": group, **payload}))
    partial.replace(path)


def read_markers(folder: str | os.PathLike, kind: str) -> dict[int, dict[str, Any]]:
    """Every group's marker of `kind` under `folder`, by group."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(folder).glob(f"{kind}-*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = json.loads(path.read_text())
            found[int(record["replica_group"])] = record
    return found


__all__ = [
    "DEFAULT_REPLICA_GROUP_RESTARTS",
    "FINISHED",
    "LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS",
    "RECORDS_FOLDER",
    "SUPERSEDED",
    "TORCHFT_REQUIREMENT",
    "FaultTolerance",
    "ReplicaGroupEnv",
    "check_fault_tolerance_platform",
    "lighthouse_arguments",
    "lighthouse_join_timeout_ms",
    "marker_path",
    "rank_environment",
    "read_markers",
    "read_replica_group_env",
    "write_marker",
]
