"""context_parallel_degree and cp_comm_type on the client: accepted layouts, refusals with the
arithmetic (issue 31). The cp group is carved out of the resolved sharding group."""

from __future__ import annotations

import pytest

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.mesh_axes import MeshAxis, rank_coordinates
from meshtrain.errors import ConfigError


def smp(**parameters: object) -> dict:
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


@pytest.mark.parametrize(("parameters", "world", "shard", "dp_size"), [
    ({"context_parallel_degree": 2}, 2, 2, 1),
    ({"context_parallel_degree": 4}, 4, 4, 1),
    ({"context_parallel_degree": 2}, 4, 4, 2),
    ({"context_parallel_degree": 2, "hybrid_shard_degree": 2}, 4, 2, 2),
    ({"context_parallel_degree": 2, "tensor_parallel_degree": 2}, 4, 2, 1),
])
def test_cp_divides_the_resolved_shard_group(parameters, world, shard, dp_size):
    degrees = resolve_degrees(SMPParameters(**parameters), world)
    assert degrees.hybrid_shard_degree == shard
    assert degrees.dp_size == dp_size  # world / (pp x tp x cp)
    assert degrees.data_parallel_degree * degrees.tensor_parallel_degree == world


def test_cp_ranks_are_innermost_in_the_shard_group():
    """cp2 x tp2 on 8 ranks: ranks (0, 2) split one row; (0, 4) see different rows."""
    degrees = resolve_degrees(SMPParameters(context_parallel_degree=2,
                                            tensor_parallel_degree=2), 8)
    cp = [rank_coordinates(degrees, r)[MeshAxis.CP] for r in range(8)]
    assert cp == [0, 0, 1, 1, 0, 0, 1, 1]
    rows = [rank_coordinates(degrees, r)[MeshAxis.SHARD_MOD_CP] for r in range(8)]
    assert rows == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("comm", ["p2p", "all_gather", "a2a"])
def test_cp_comm_type_is_a_parameter(comm):
    config = DistributionConfig.from_dict(smp(context_parallel_degree=2, cp_comm_type=comm))
    assert config.smp.cp_comm_type == comm
    assert SMPParameters().cp_comm_type == "p2p"


@pytest.mark.parametrize(("parameters", "world", "fragment"), [
    ({"context_parallel_degree": 3}, 8,
     "context_parallel_degree=3 must divide the resolved hybrid_shard_degree=8 (world size 8 "
     "(2 hosts x 4 processes)): the context-parallel group is carved out of the sharding "
     "group. Use context_parallel_degree 1, 2, 4 or 8."),
    ({"context_parallel_degree": 4, "tensor_parallel_degree": 4}, 8,
     "context_parallel_degree=4 must divide the resolved hybrid_shard_degree=2"),
    ({"context_parallel_degree": 2, "sharding_strategy": "no_shard"}, 8,
     "resolved hybrid_shard_degree=1"),
])
def test_resolution_refuses_with_the_arithmetic(parameters, world, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_degrees(SMPParameters(**parameters), world,
                        world_description="2 hosts x 4 processes")
    assert fragment in str(info.value)


@pytest.mark.parametrize(("parameters", "fragment"), [
    ({"context_parallel_degree": 4, "hybrid_shard_degree": 2},
     "context_parallel_degree=4 > hybrid_shard_degree=2: the context-parallel group is carved "
     "out of the sharding group. Use hybrid_shard_degree >= 4"),
    ({"context_parallel_degree": 2, "cp_comm_type": "ring"}, "cp_comm_type"),
    ({"context_parallel_degree": 0}, "context_parallel_degree"),
    ({"context_parallel_degree": 2, "pipeline_parallel_degree": 2, "microbatches": 2},
     "context_parallel_degree=2 with pipeline_parallel_degree=2 is not supported"),
    ({"context_parallel_degree": 2, "expert_parallel_degree": 2},
     "context_parallel_degree=2 with expert_parallel_degree=2 is not supported"),
    ({"context_parallel_degree": 2, "compile": True}, "compile=True with context_parallel"),
])
def test_bad_parameters_are_config_errors_before_launch(parameters, fragment):
    with pytest.raises(ConfigError) as info:
        DistributionConfig.from_dict(smp(**parameters))
    assert fragment in str(info.value)
