"""Issue 36, the client's contract: torch_distributed.fault_tolerance, its checks and rank env.

The Estimator-level refusals (nothing created before them) are in the bad-input catalogue
(tests/sdk/backends/sagemaker/bad_input_cases.py, "ft-*"); here: the pieces one by one.
"""

from __future__ import annotations

import pytest

from meshtrain.contract import env as names
from meshtrain.contract.degrees import resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import (
    FaultTolerance,
    check_fault_tolerance_platform,
    rank_environment,
    read_replica_group_env,
)
from meshtrain.contract.fault_tolerance_checks import check_fault_tolerance
from meshtrain.estimator_checks import check_cluster, check_fault_tolerance_target
from meshtrain.targets import resolve_target


def distribution(groups: int = 2, **parameters) -> dict:
    return {"torch_distributed": {"enabled": True, "processes_per_host": 2,
                                  "fault_tolerance": {"replica_groups": groups}},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


def checked(hosts: int, groups: int, **parameters) -> None:
    config = DistributionConfig.from_dict(distribution(groups, **parameters))
    degrees = resolve_degrees(config.smp, hosts * 2, ranks_per_host=2)
    check_fault_tolerance(config, instance_count=hosts, processes_per_host=2, degrees=degrees)


def test_the_option_round_trips_with_its_defaults():
    config = DistributionConfig.from_dict(distribution(2, hybrid_shard_degree=2))
    ft = config.torch_distributed.fault_tolerance
    assert ft == FaultTolerance(replica_groups=2)
    assert (ft.min_replica_groups, ft.quorum_timeout_seconds) == (1, 60)
    assert DistributionConfig.from_dict(config.to_dict()) == config
    assert DistributionConfig.from_dict({"torch_distributed": {"enabled": True}}
                                        ).torch_distributed.fault_tolerance is None


@pytest.mark.parametrize(("hosts", "groups", "parameters"), [
    (2, 2, {"hybrid_shard_degree": 2}),  # the acceptance layout: 2 hosts x 2, one group a host
    (4, 2, {"hybrid_shard_degree": 4}),  # two hosts per group
    (4, 4, {"sharding_strategy": "hybrid_shard"}),  # hsd 0 resolves to a host's 2 ranks
])
def test_one_sharding_group_per_replica_group_is_accepted(hosts, groups, parameters):
    checked(hosts, groups, **parameters)


@pytest.mark.parametrize(("hosts", "groups", "parameters", "message"), [
    (4, 3, {"hybrid_shard_degree": 2}, "replica_groups=3 does not divide instance_count=4: "
     "every replica group is a whole number of hosts. Use replica_groups 2 or 4, or an "
     "instance_count that is a multiple of 3"),
    (4, 2, {"hybrid_shard_degree": 2}, "each group has 2 host(s) x 2 processes = 4 ranks, but "
     "the resolved hybrid_shard_degree is 2"),
    (4, 2, {"hybrid_shard_degree": 2}, "Set hybrid_shard_degree=4, or replica_groups=4"),
    (2, 2, {}, "the resolved hybrid_shard_degree is 4"),  # full sharding: one group of 4
    (2, 2, {"hybrid_shard_degree": 1, "pipeline_parallel_degree": 2, "microbatches": 2},
     "pipeline_parallel_degree=2: fault-tolerant replica groups run hybrid sharding only"),
])
def test_layouts_that_are_not_one_sharding_group_per_replica_group_are_refused(
        hosts, groups, parameters, message):
    with pytest.raises(ConfigError) as error:
        checked(hosts, groups, **parameters)
    assert message in str(error.value)


def test_the_estimator_check_runs_it_against_the_cluster():
    target = resolve_target("local")
    with pytest.raises(ConfigError, match="resolved hybrid_shard_degree is 2"):
        check_cluster(distribution(2, hybrid_shard_degree=2), target, 4, "train.py")
    _, world, degrees = check_cluster(distribution(2, hybrid_shard_degree=2), target, 2,
                                      "train.py")
    assert (world, degrees.replicate_degree, degrees.hybrid_shard_degree) == (4, 2, 2)


def test_platforms_torchft_has_no_wheels_for_are_refused_with_the_reason():
    check_fault_tolerance_platform("Linux", "x86_64", where="this machine")
    for system, machine in (("Darwin", "arm64"), ("Linux", "aarch64"), ("Windows", "AMD64")):
        with pytest.raises(ConfigError) as error:
            check_fault_tolerance_platform(system, machine, where="this machine")
        assert f"Linux x86_64 only, but this machine is {system} {machine}" in str(error.value)
    with pytest.raises(ConfigError, match=r"'k8s:ml.c7g.4xlarge' \(Graviton\) is Linux aarch64"):
        check_fault_tolerance_target(resolve_target("k8s:ml.c7g.4xlarge"))
    check_fault_tolerance_target(resolve_target("k8s:ml.g5.12xlarge"))  # x86_64 GPU hosts


def environment(group: str = "1", groups: str = "2") -> dict[str, str]:
    return {names.MESHTRAIN_FT_REPLICA_GROUP: group, names.MESHTRAIN_FT_REPLICA_GROUPS: groups,
            names.MESHTRAIN_FT_LIGHTHOUSE: "http://127.0.0.1:29510"}


def test_a_rank_reads_its_replica_group_and_the_options_from_its_environment():
    assert read_replica_group_env({}) is None
    plain = read_replica_group_env(environment())
    assert (plain.replica_group, plain.replica_groups, plain.lighthouse) == (
        1, 2, "http://127.0.0.1:29510")
    assert (plain.min_replica_groups, plain.quorum_timeout_seconds) == (1, 60)
    options = rank_environment(FaultTolerance(replica_groups=2, min_replica_groups=2,
                                              quorum_timeout_seconds=15))
    read = read_replica_group_env({**environment(), **options})
    assert (read.min_replica_groups, read.quorum_timeout_seconds) == (2, 15)


@pytest.mark.parametrize(("env", "message"), [
    ({names.MESHTRAIN_FT_REPLICA_GROUP: "0"}, "MESHTRAIN_FT_LIGHTHOUSE, "
     "MESHTRAIN_FT_REPLICA_GROUPS missing"),
    (environment(group="2"), "MESHTRAIN_FT_REPLICA_GROUP=2 is not in 0..1"),
    (environment(groups="two"), "is not an int"),
])
def test_an_incomplete_or_wrong_environment_is_refused(env, message):
    with pytest.raises(ConfigError) as error:
        read_replica_group_env(env)
    assert message in str(error.value)
