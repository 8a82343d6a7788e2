"""Replica groups of a fault-tolerant job: which hosts form each one, and what each host is told.

With ``torch_distributed.fault_tolerance = {"replica_groups": N}`` the hosts of one replica of
the hybrid-sharded replicate dimension form a replica group: hosts are taken in order (algo-1,
algo-2, ...), ``instance_count / N`` to a group, so that group g holds the global ranks
``g * R .. (g + 1) * R - 1`` with R = world / N = hybrid_shard_degree, exactly the ranks of one
replicate coordinate of the mesh. Each group is a torchrun world of its own (its own rendezvous);
the groups meet only through the torchft lighthouse. See docs/fault-tolerance.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import FaultTolerance, rank_environment
from meshtrain.contract.jobspec import JobSpec

__all__ = ["ReplicaGroups", "fault_tolerance_of", "ft_environment", "replica_groups_of"]


def fault_tolerance_of(spec: JobSpec) -> FaultTolerance | None:
    """The job's ``torch_distributed.fault_tolerance``, or None."""
    return spec.distribution_config().torch_distributed.fault_tolerance


def replica_groups_of(spec: JobSpec) -> int | None:
    """N of ``torch_distributed.fault_tolerance.replica_groups``, or None without it."""
    fault_tolerance = fault_tolerance_of(spec)
    return fault_tolerance.replica_groups if fault_tolerance is not None else None


@dataclass(frozen=True)
class ReplicaGroups:
    """The hosts of each replica group, in host order."""

    groups: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, hosts: list[str], count: int) -> ReplicaGroups:
        """Split `hosts` (algo-1, algo-2, ... in that order) into `count` equal groups."""
        if count < 1 or len(hosts) % count:
            raise ConfigError(
                f"fault_tolerance.replica_groups={count} does not divide instance_count="
                f"{len(hosts)}: each replica group is a whole number of hosts. Use a divisor of "
                f"{len(hosts)} (or change instance_count).")
        ordered = sorted(hosts, key=_host_number)
        size = len(hosts) // count
        return cls(tuple(tuple(ordered[g * size:(g + 1) * size]) for g in range(count)))

    @property
    def count(self) -> int:
        return len(self.groups)

    def group_of(self, host: str) -> int:
        """The replica group `host` belongs to."""
        for index, hosts in enumerate(self.groups):
            if host in hosts:
                return index
        raise KeyError(host)

    def first_host(self, group: int) -> str:
        """The host that holds rank 0 of `group`'s torchrun world (its rendezvous master)."""
        return self.groups[group][0]


def ft_environment(group: int, fault_tolerance: FaultTolerance, lighthouse: str,
                   coordination_dir: Path) -> dict[str, str]:
    """What a host of replica group `group` (and every rank under it) is told: its group, the
    number of groups, the lighthouse, the folder the groups share, and the option's settings
    the ranks read."""
    return {names.MESHTRAIN_FT_REPLICA_GROUP: str(group),
            names.MESHTRAIN_FT_REPLICA_GROUPS: str(fault_tolerance.replica_groups),
            names.MESHTRAIN_FT_LIGHTHOUSE: lighthouse,
            names.MESHTRAIN_FT_COORDINATION_DIR: str(coordination_dir),
            **rank_environment(fault_tolerance)}


def _host_number(host: str) -> tuple[int, str]:
    """algo-10 after algo-9 (hosts are numbered, not spelled)."""
    prefix, _, number = host.rpartition("-")
    return (int(number), prefix) if number.isdigit() else (0, host)
