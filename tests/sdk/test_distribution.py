"""DistributionConfig and degree resolution: valid shapes, and every invalid one a ConfigError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtrain import ConfigError
from meshtrain.contract import DistributionConfig, SMPParameters, resolve_degrees


def smp(**parameters):
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


def test_smp_v2_shape_keeps_defaults_and_raw_parameters():
    config = DistributionConfig.from_dict(smp(hybrid_shard_degree=2, tensor_parallel_degree=2))
    assert config.model_parallel_enabled
    assert config.smp.hybrid_shard_degree == 2
    assert config.smp.activation_loading_horizon == 2  # SMP default
    assert config.smp.sm_activation_offloading is True  # SMP default
    assert config.raw_parameters == {"hybrid_shard_degree": 2, "tensor_parallel_degree": 2}


def test_parameters_from_json_file(tmp_path):
    path = tmp_path / "smp.json"
    path.write_text(json.dumps({"hybrid_shard_degree": 4}))
    dist = {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": str(path)}}}
    assert DistributionConfig.from_dict(dist).smp.hybrid_shard_degree == 4


def test_processes_per_host_defaults():
    plain = DistributionConfig.from_dict({"torch_distributed": {"enabled": True}})
    assert plain.processes_per_host(num_gpus=8) == 8
    assert plain.processes_per_host(num_gpus=0) == 1
    explicit = DistributionConfig.from_dict(
        {"torch_distributed": {"enabled": True, "processes_per_host": 3}})
    assert explicit.processes_per_host(num_gpus=8) == 3
    assert DistributionConfig.from_dict(None).processes_per_host(num_gpus=8) == 1


INVALID = [
    ("not a dict", "must be a dict"),
    ({"torch_distributd": {"enabled": True}}, "Did you mean 'torch_distributed'"),
    ({"torch_distributed": {"enabled": "yes"}}, "valid boolean"),
    ({"torch_distributed": {"enabled": True, "processes_per_host": 0}}, "processes_per_host"),
    ({"torch_distributed": {"enabled": True, "processes_per_host": 1.5}}, "processes_per_host"),
    ({"torch_distributed": {"enabled": True, "nprocs": 2}}, "Allowed keys"),
    # a key of another level says where it belongs (a degree is an SMP parameter)
    ({"torch_distributed": {"enabled": True, "tensor_parallel_degree": 2}},
     "distribution.torch_distributed.tensor_parallel_degree: unknown key. It belongs under "
     "distribution.smdistributed.modelparallel.parameters. Allowed keys: "),
    (smp(processes_per_host=2), "It belongs under distribution.torch_distributed."),
    ({"mpi": {"enabled": True}}, "torch_distributed"),
    ({"pytorchddp": {"enabled": True}}, "torch_distributed"),
    ({"parameter_server": {"enabled": True}}, "torch_distributed"),
    ({"smdistributed": {"dataparallel": {"enabled": True}}}, "SMDDP"),
    ({"smdistributed": "yes"}, "must be a dict"),
    ({"smdistributed": {"modelparallel": {"enabled": True}}}, "torch_distributed"),
    ({"instance_groups": []}, "heterogeneous"),
    (smp(hybrid_shard_degre=2), "Did you mean 'hybrid_shard_degree'"),
    (smp(hybrid_shard_degree=-1), "hybrid_shard_degree"),
    (smp(hybrid_shard_degree="2"), "hybrid_shard_degree"),
    (smp(tensor_parallel_degree=0), "tensor_parallel_degree"),
    (smp(tensor_parallel_degree=True), "tensor_parallel_degree"),
    (smp(tensor_parallel_degree=2, expert_parallel_degree=0), "expert_parallel_degree"),
    (smp(context_parallel_degree=4, hybrid_shard_degree=2), "context_parallel_degree=4"),
    (smp(activation_loading_horizon=0), "activation_loading_horizon"),
    (smp(activation_offloading=True), "activation_checkpointing"),
    (smp(sharding_strategy="zero3"), "sharding_strategy"),
    (smp(sharding_strategy="no_shard", hybrid_shard_degree=4), "contradicts"),
    (smp(sharding_strategy="full_shard", hybrid_shard_degree=1), "contradicts"),
    (smp(mixed_precision="fp8"), "mixed_precision"),
    ({"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": "/no/such/file.json"}}}, "not an existing file"),
    ({"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": 7}}}, "must be a dict or a path"),
]


@pytest.mark.parametrize(("distribution", "fragment"), INVALID)
def test_invalid_distribution_is_config_error_with_fix(distribution, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        DistributionConfig.from_dict(distribution)
    assert isinstance(info.value, ValueError)
    assert fragment in str(info.value)


scalars = (st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=False)
           | st.text(max_size=6))
json_values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=3)
                      | st.dictionaries(st.text(max_size=8), children, max_size=3)),
    max_leaves=8,
)
smp_keys = st.sampled_from([*sorted(SMPParameters.model_fields), "bogus"])
smp_dicts = st.dictionaries(smp_keys, json_values | st.integers(0, 8), max_size=5)
distributions = st.one_of(
    json_values,
    st.fixed_dictionaries({"torch_distributed": st.dictionaries(
        st.sampled_from(["enabled", "processes_per_host", "x"]), json_values, max_size=2)}),
    st.builds(lambda enabled, params: {"torch_distributed": {"enabled": enabled},
                                       "smdistributed": {"modelparallel": {
                                           "enabled": True, "parameters": params}}},
              st.booleans(), smp_dicts),
)


@settings(max_examples=300, deadline=None)
@given(distributions)
def test_any_input_validates_or_raises_config_error(distribution):
    try:
        config = DistributionConfig.from_dict(distribution)
    except ConfigError:
        return
    assert isinstance(config, DistributionConfig)


@pytest.mark.parametrize(("parameters", "world", "expected"), [
    ({}, 4, (1, 4, 1, "full_shard")),
    ({"hybrid_shard_degree": 2}, 4, (2, 2, 1, "hybrid_shard")),
    ({"hybrid_shard_degree": 1}, 4, (4, 1, 1, "no_shard")),
    ({"tensor_parallel_degree": 2}, 8, (1, 4, 2, "full_shard")),
    ({"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}, 8, (2, 2, 2, "hybrid_shard")),
    ({"sharding_strategy": "shard_grad_op", "hybrid_shard_degree": 2}, 8,
     (4, 2, 1, "_hybrid_shard_zero2")),
    ({"sharding_strategy": "no_shard"}, 4, (4, 1, 1, "no_shard")),
    ({"expert_parallel_degree": 2}, 4, (1, 4, 1, "full_shard")),
])
def test_resolve_degrees(parameters, world, expected):
    resolved = resolve_degrees(SMPParameters(**parameters), world)
    got = (resolved.replicate_degree, resolved.hybrid_shard_degree,
           resolved.tensor_parallel_degree, resolved.sharding_strategy)
    assert got == expected
    assert resolved.replicate_degree * resolved.hybrid_shard_degree * \
        resolved.tensor_parallel_degree == world


def test_hybrid_strategy_with_degree_zero_shards_within_a_host():
    params = SMPParameters(sharding_strategy="hybrid_shard")
    resolved = resolve_degrees(params, 16, ranks_per_host=8)
    assert (resolved.replicate_degree, resolved.hybrid_shard_degree) == (2, 8)


@pytest.mark.parametrize(("parameters", "world", "fragment"), [
    ({"tensor_parallel_degree": 3}, 8, "tensor_parallel_degree=3 does not divide world size 8 "
                                       "(2 hosts x 4 processes). Use 1, 2, 4 or 8."),
    ({"hybrid_shard_degree": 3}, 8, "hybrid_shard_degree=3 does not divide the data-parallel "
                                    "size 8"),
    ({"hybrid_shard_degree": 4, "tensor_parallel_degree": 4}, 8, "data-parallel size 2"),
    ({"expert_parallel_degree": 3, "hybrid_shard_degree": 4}, 8, "expert_parallel_degree=3"),
    ({"context_parallel_degree": 3}, 8, "context_parallel_degree=3 must divide"),
])
def test_resolve_degrees_errors_show_arithmetic(parameters, world, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_degrees(SMPParameters(**parameters), world,
                        world_description="2 hosts x 4 processes")
    assert fragment in str(info.value)
