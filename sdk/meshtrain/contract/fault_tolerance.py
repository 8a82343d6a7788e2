"""Fault-tolerant replica groups: the ``torch_distributed.fault_tolerance`` option and its checks.

``{"torch_distributed": {"enabled": True, "fault_tolerance": {"replica_groups": N}}}`` with SMP's
``hybrid_shard_degree``: the hosts of one replica of the HSDP replicate dimension form a replica
group that may fail alone. Each group is its own torchrun world (shard axis only); gradients are
averaged across the LIVE groups through torchft (docs/fault-tolerance.md). This module holds the
pydantic model, the client's checks (layout and platform) and the environment a rank reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from meshtrain.contract import env as names
from meshtrain.contract._messages import divisors
from meshtrain.contract.errors import ConfigError

if TYPE_CHECKING:
    from meshtrain.contract.degrees import ResolvedDegrees
    from meshtrain.contract.distribution import DistributionConfig

TORCHFT_REQUIREMENT = "torchft==0.2.0"
"""What ``pip install 'meshtrain[ft]'`` installs (Linux x86_64 wheels only)."""
SUPPORTED_PLATFORM = ("linux", "x86_64")
MIN_REPLICA_GROUPS_ENV = "MESHTRAIN_FT_MIN_REPLICA_GROUPS"
QUORUM_TIMEOUT_ENV = "MESHTRAIN_FT_QUORUM_TIMEOUT_SECONDS"
RECORDS_FOLDER = "fault_tolerance"
"""``<output data dir>/fault_tolerance/replica-<g>.jsonl``: one JSON line per step per group."""


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


def check_fault_tolerance(config: DistributionConfig, *, instance_count: int,
                          processes_per_host: int, degrees: ResolvedDegrees | None) -> None:
    """The client's check of a fault-tolerant layout (ConfigError with the arithmetic)."""
    ft = config.torch_distributed.fault_tolerance
    if ft is None:
        return
    n = ft.replica_groups
    if degrees is None:
        raise ConfigError(
            f"torch_distributed.fault_tolerance (replica_groups={n}) makes each replica of "
            "hybrid sharding a replica group, but smdistributed.modelparallel is not enabled. "
            "Add 'smdistributed': {'modelparallel': {'enabled': True, 'parameters': "
            f"{{'hybrid_shard_degree': <ranks per group>}}}} to the distribution.")
    if instance_count % n:
        usable = [str(d) for d in divisors(instance_count) if d >= 2]
        fix = f"Use replica_groups {' or '.join(usable)}, or" if usable else "Use"
        raise ConfigError(
            f"fault_tolerance.replica_groups={n} does not divide instance_count="
            f"{instance_count}: every replica group is a whole number of hosts. {fix} an "
            f"instance_count that is a multiple of {n}.")
    _check_plain_sharding(degrees, n)
    per_group, shard = degrees.world_size // n, degrees.hybrid_shard_degree
    if shard != per_group:
        groups = degrees.world_size // shard
        other = f", or replica_groups={groups}" if groups >= 2 and groups != n else ""
        raise ConfigError(
            f"fault_tolerance.replica_groups={n}: each group has {instance_count // n} "
            f"host(s) x {processes_per_host} processes = {per_group} ranks, but the resolved "
            f"hybrid_shard_degree is {shard}: a replica group must be exactly one sharding "
            "group (the replicate dimension spans the groups). Set hybrid_shard_degree="
            f"{per_group}{other}.")


def _check_plain_sharding(degrees: ResolvedDegrees, n: int) -> None:
    others = {"tensor_parallel_degree": degrees.tensor_parallel_degree,
              "pipeline_parallel_degree": degrees.pipeline_parallel_degree,
              "context_parallel_degree": degrees.context_parallel_degree,
              "expert_parallel_degree": degrees.expert_parallel_degree}
    given = {key: value for key, value in others.items() if value > 1}
    if given:
        listed = ", ".join(f"{key}={value}" for key, value in given.items())
        raise ConfigError(
            f"fault_tolerance.replica_groups={n} with {listed}: fault-tolerant replica groups "
            "run hybrid sharding only in this build (each group one sharding group, gradients "
            "averaged across the live groups). Set those degrees to 1, or remove "
            "fault_tolerance.")


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
    return ReplicaGroupEnv(group, count, environ[keys[2]], minimum, timeout)


__all__ = [
    "RECORDS_FOLDER",
    "TORCHFT_REQUIREMENT",
    "FaultTolerance",
    "ReplicaGroupEnv",
    "check_fault_tolerance",
    "check_fault_tolerance_platform",
    "rank_environment",
    "read_replica_group_env",
]
