"""Tensor parallelism x expert parallelism (issue 32) on 4 gloo ranks, one torchrun launch.

The worker (tests/runtime/workers/ep_tp_parity.py) builds the meshes as the runtime does (the EP
group folded over shard x tp), TP on attention / embedding / head, EP with each tp rank's share
of the tokens, FSDP2 or HSDP, and compares a tiny HF Mixtral with one process on the global batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshtrain.contract import parse_smp_parameters, resolve_degrees
from meshtrain.contract.mesh_axes import MeshAxis, rank_coordinates

WORKERS = Path(__file__).parent / "workers"
TOL = 1e-5  # float32 parity (measured: logits <= 9e-8, gradients <= 5e-8)
CASES = ("tp2_ep2_fsdp_top2", "tp2_ep2_hsdp_top1", "tp2_ep4_fsdp_top2", "tp2_ep2_transform_top2")


@pytest.fixture(scope="module")
def four(torchrun) -> dict[str, dict[str, Any]]:
    records = torchrun(WORKERS / "ep_tp_parity.py", 4, "four", timeout=300)
    return {r["case"]: r for r in records if r["rank"] == 0}


@pytest.mark.multiprocess
def test_tp_x_ep_mixtral_matches_one_process(four):
    for name in CASES:
        case = four[name]
        assert case["logits_err"] < TOL, name
        assert abs(case["loss"] - case["ref_loss"]) < TOL, name
        assert case["aux_err"] < TOL and case["z_err"] < TOL, name
        assert case["grad_err"] < TOL, (name, case["worst_grad"])
    assert four["tp2_ep2_hsdp_top1"]["degrees"]["replicate"] == 2  # composed with HSDP


@pytest.mark.multiprocess
def test_tokens_are_split_over_tp_so_none_is_routed_twice(four):
    for name in CASES:
        case = four[name]
        # Every rank dispatches its tp share x top_k rows per layer; together: each token once.
        assert case["rows_sent"] == case["rows_theory"], name
        assert sum(case["rows_sent"]) == case["global_assignments"], name
        assert all(b > 0 for b in case["remote_bytes"]), name


@pytest.mark.multiprocess
def test_state_lists_the_folded_expert_groups(four):
    groups = four["tp2_ep2_fsdp_top2"]["groups"]
    # tp2 x ep2 on 4 ranks (shard 2): the EP group is the tp pair; same experts across shard.
    assert [g["ep"] for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["expert_data_parallel"] for g in groups] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [g["token_split"] for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert four["tp2_ep2_fsdp_top2"]["experts_held"] == [[0, 0], [2, 2], [0, 0], [2, 2]]
    wide = four["tp2_ep4_fsdp_top2"]
    assert all(g["ep"] == [0, 1, 2, 3] for g in wide["groups"])  # over shard x tp
    assert wide["experts_held"] == [[0, 0], [1, 1], [2, 2], [3, 3]]


@pytest.mark.multiprocess
def test_experts_split_by_tensor_parallelism_are_refused(four):
    message = four["tp_split_experts"]["message"]
    assert message and "split by tensor parallelism" in message
    assert "tp_plan_without_experts" in message


def test_contract_folds_ep_over_shard_and_tp():
    params = parse_smp_parameters({"tensor_parallel_degree": 2, "expert_parallel_degree": 4})
    degrees = resolve_degrees(params, 4)
    assert (degrees.hybrid_shard_degree, degrees.expert_parallel_degree) == (2, 4)
    coordinates = [rank_coordinates(degrees, rank) for rank in range(4)]
    assert [c[MeshAxis.EP] for c in coordinates] == [0, 1, 2, 3]
    assert [c[MeshAxis.SHARD_MOD_EP] for c in coordinates] == [0, 0, 0, 0]
    bad = parse_smp_parameters({"tensor_parallel_degree": 2, "expert_parallel_degree": 3})
    with pytest.raises(ValueError, match=r"hybrid_shard_degree=2 x tensor_parallel_degree=2 = 4"):
        resolve_degrees(bad, 4)


def test_sequence_parallel_with_expert_parallelism_is_refused():
    with pytest.raises(ValueError, match="sequence_parallel=True is not supported"):
        parse_smp_parameters({"tensor_parallel_degree": 2, "expert_parallel_degree": 2,
                              "sequence_parallel": True})
