"""The client's check of a fault-tolerant layout against the resolved degrees (ConfigError with the
arithmetic); above both the option (fault_tolerance.py) and the degrees, so neither imports the
other."""

from __future__ import annotations

from meshtrain.contract._messages import divisors
from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError


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


__all__ = ["check_fault_tolerance"]
