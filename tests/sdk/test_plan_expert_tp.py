"""The planner under tensor parallelism x expert parallelism (issue 32): expert shards and the
all-to-all volume follow the runtime's layout (EP folded over shard x tp, experts whole, each tp
rank dispatching its share of the tokens)."""

from __future__ import annotations

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan.comm import all_gather_bytes, all_to_all_bytes, communication_volumes
from meshtrain.plan.memory import Training, expert_shard_degree, group_shard_elements
from meshtrain.plan.models import ModelSpec, param_groups

MOE = ModelSpec(name="moe", family="mixtral", hidden_size=64, num_layers=2,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                vocab_size=128, num_experts=4, experts_per_token=2)


def _degrees(world: int, **parameters):
    return resolve_degrees(SMPParameters(**parameters), world)


def test_expert_shard_degree_folds_over_shard_and_tp():
    assert expert_shard_degree(shard=2, tp=2, ep=2) == 2  # state.expert_group_ranks' size
    assert expert_shard_degree(shard=2, tp=2, ep=4) == 1
    assert expert_shard_degree(shard=4, tp=1, ep=2) == 2  # EP alone: shard / ep
    assert expert_shard_degree(shard=4, tp=2, ep=1) == 4  # no EP: the shard group


def test_experts_are_not_split_by_tp_under_ep():
    gate_up = next(g for g in param_groups(MOE) if g.name == "experts.gate_up_proj")
    # (4 experts, 2*96, 64): ep=2 keeps 2 whole experts, FSDP over shard x tp / ep = 2 ranks
    assert group_shard_elements(gate_up, tp=2, ep=2, shard=2) == 2 * 2 * 96 * 64 // 2
    # without EP the HF plan splits them over tp (and FSDP over the shard group)
    assert group_shard_elements(gate_up, tp=2, ep=1, shard=2) == 4 * 96 * 64 // 2


def test_tp_x_ep_all_to_all_volume_is_each_tp_ranks_share():
    training = Training(seq_len=32, micro_batch=2)
    degrees = _degrees(4, tensor_parallel_degree=2, expert_parallel_degree=2)
    volumes = communication_volumes(MOE, degrees, training)
    tokens = 2 * 32
    share = 2 * (tokens // 2 * 2) * 64  # bf16 x (tokens / tp) x k x h
    gathers = 2 * all_gather_bytes(2, 2 * tokens * 64)  # outputs fwd, input grads bwd
    assert volumes.expert_all_to_all == 2 * (4 * all_to_all_bytes(2, share) + gathers)
    # Half the routed bytes of dispatching every tp rank's full (shared) token set.
    full = 2 * 4 * all_to_all_bytes(2, 2 * tokens * 2 * 64)
    assert 4 * all_to_all_bytes(2, share) * 2 == full / 2
