"""transform() from the parameters dict on every parallel layout, against one process.

Three torchrun launches (2, 4 and 8 gloo ranks) of tests/runtime/workers/integ_parity.py; each
runs many cases through ``meshtrain_runtime.init(params)`` + ``transform(model)`` and reports
them (errors maxed over ranks). Bounds: float32 loss within 1e-5 over 3 AdamW steps on the same
global batches; clipped gradient norms within 1e-5 relative (sums in another order); first-step
gradients within 1e-6 (values of order 1e-2, float32 sums in another order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).parent / "workers" / "integ_parity.py"

LOSS_BOUND = 1e-5
NORM_REL_BOUND = 1e-5
GRAD_BOUND = 1e-6

PARITY_CASES = {
    2: ("llama_tp2", "llama_tp2_sp", "neox_tp2"),
    4: ("llama_tp2_hsd2", "llama_tp2_hsd2_sp", "llama_tp2_noshard_sp", "mixtral_ep2_top1",
        "mixtral_ep2_top2_config", "mixtral_ep4_top2", "mixtral_ep2_hsd2_top2",
        "mixtral_ep2_top2_ac", "mixtral_ep2_top2_selective", "llama_tp2_hsd2_sp_offload"),
    8: ("llama_tp2_hsd2_rep2", "llama_tp2_hsd2_rep2_sp"),
}
COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")


def _launch(torchrun: Any, world: int, timeout: float) -> dict[str, dict[str, Any]]:
    records = torchrun(WORKER, world, str(world), timeout=timeout)
    cases = {record["case"]: record for record in records}
    failed = {name: record["error"] for name, record in cases.items() if "error" in record}
    assert not failed, "\n\n".join(f"{name}:\n{trace}" for name, trace in failed.items())
    return cases


@pytest.fixture(scope="module")
def two(torchrun: Any) -> dict[str, dict[str, Any]]:
    return _launch(torchrun, 2, timeout=300)


@pytest.fixture(scope="module")
def four(torchrun: Any) -> dict[str, dict[str, Any]]:
    return _launch(torchrun, 4, timeout=420)


@pytest.fixture(scope="module")
def eight(torchrun: Any) -> dict[str, dict[str, Any]]:
    return _launch(torchrun, 8, timeout=420)


@pytest.fixture(params=[2, 4, 8], ids=["2ranks", "4ranks", "8ranks"])
def launch(request: pytest.FixtureRequest) -> tuple[int, dict[str, dict[str, Any]]]:
    world = request.param
    return world, request.getfixturevalue({2: "two", 4: "four", 8: "eight"}[world])


@pytest.mark.multiprocess
def test_losses_norms_and_gradients_match_one_process(launch) -> None:
    world, cases = launch
    for name in PARITY_CASES[world]:
        case = cases[name]
        print(f"{name}: loss err {case['loss_err']:.1e}, clip norm rel err "
              f"{case['clip_norm_rel_err']:.1e}, grad err {case['grad_err']:.1e}")
        assert case["loss_err"] <= LOSS_BOUND, case
        assert len(case["clip_norms"]) == 3 and min(case["ref_clip_norms"]) > 0.5  # it clipped
        assert case["clip_norm_rel_err"] <= NORM_REL_BOUND, case
        assert case["norm_rel_err"] <= NORM_REL_BOUND, case  # orders 1 and inf
        assert case["grad_err"] <= GRAD_BOUND, case  # clipped first-step gradients
        assert case["losses"][-1] != case["losses"][0]  # it trains


@pytest.mark.multiprocess
def test_pure_tensor_parallelism_keeps_fsdp_for_mixed_precision(two) -> None:
    case = two["llama_tp2_bf16"]
    assert case["fsdp"]  # the bf16 policy is FSDP's, applied over the one data-parallel rank
    assert case["degrees"]["hybrid_shard_degree"] == 1
    assert {tuple(v["axes"]) for v in case["placements"].values()} == {("shard", "tp")}
    # bf16 compute: not the fp32 result, but close to it (as in test_transform.py's bf16 test).
    assert 0 < case["loss_err"] <= 2e-2, case["loss_err"]


@pytest.mark.multiprocess
def test_degrees_and_fsdp_follow_the_parameters(launch) -> None:
    world, cases = launch
    expected = {  # (replicate, shard, tp, ep, FSDP applied)
        "llama_tp2": (1, 1, 2, 1, False), "neox_tp2": (1, 1, 2, 1, False),
        "llama_tp2_hsd2": (1, 2, 2, 1, True), "llama_tp2_noshard_sp": (2, 1, 2, 1, True),
        "mixtral_ep2_top1": (1, 4, 1, 2, True),
        "mixtral_ep4_top2": (1, 4, 1, 4, True), "mixtral_ep2_hsd2_top2": (2, 2, 1, 2, True),
        "llama_tp2_hsd2_rep2": (2, 2, 2, 1, True),
    }
    for name in PARITY_CASES[world]:
        if name not in expected:
            continue
        d = cases[name]["degrees"]
        got = (d["replicate_degree"], d["hybrid_shard_degree"], d["tensor_parallel_degree"],
               d["expert_parallel_degree"], cases[name]["fsdp"])
        assert got == expected[name], name


@pytest.mark.multiprocess
def test_tensor_parallel_placements(launch) -> None:
    world, cases = launch
    for name in PARITY_CASES[world]:
        case = cases[name]
        if case["kind"] != "llama":
            continue
        checked = 0
        for param, layout in case["placements"].items():
            assert "tp" in layout["axes"], (name, param, layout)
            on_tp = layout["placements"][layout["axes"].index("tp")]
            if any(f".{proj}." in param for proj in COLWISE):
                assert on_tp == "Shard(dim=0)", (name, param, layout)
                checked += 1
            elif any(f".{proj}." in param for proj in ROWWISE):
                assert on_tp == "Shard(dim=1)", (name, param, layout)
                checked += 1
            elif "norm" in param:
                assert on_tp == "Replicate()", (name, param, layout)
        assert checked == 2 * 7, name  # 2 layers x 7 projections
        degrees = case["degrees"]
        dp_axes = ["replicate", "shard"] if degrees["replicate_degree"] > 1 else \
            ["shard"] if case["fsdp"] else []
        assert {tuple(v["axes"]) for v in case["placements"].values()} == {(*dp_axes, "tp")}


@pytest.mark.multiprocess
def test_sequence_parallel_gradients_are_reduced(launch) -> None:
    world, cases = launch
    for name in PARITY_CASES[world]:
        case = cases[name]
        assert case["partial_grads"] == [], name  # no Partial norm gradient left after backward
        assert case["tp_sequence_parallel"] == (True if "_sp" in name else
                                                False if "tp2" in name else None)


@pytest.mark.multiprocess
def test_checkpointing_combined_with_tensor_and_expert_parallelism(launch) -> None:
    world, cases = launch
    for name in PARITY_CASES[world]:
        # Both layers of the checkpointed cases (their parity is checked above).
        expected = 2 if name in ("mixtral_ep2_top2_ac", "mixtral_ep2_top2_selective",
                                 "llama_tp2_hsd2_sp_offload") else 0
        assert cases[name]["checkpointed"] == expected, name


@pytest.mark.multiprocess
def test_expert_parallel_placements(four) -> None:
    for name in ("mixtral_ep2_top1", "mixtral_ep4_top2", "mixtral_ep2_hsd2_top2"):
        case = four[name]
        expert_axes = ["replicate", "shard_mod_ep", "ep"] if "hsd2" in name else \
            ["shard_mod_ep", "ep"]
        dp_axes = ["replicate", "shard"] if "hsd2" in name else ["shard"]
        experts = {k: v for k, v in case["placements"].items() if ".experts." in k}
        assert len(experts) == 4, name  # gate_up_proj and down_proj of 2 layers
        for param, layout in case["placements"].items():
            if param in experts:
                assert layout["axes"] == expert_axes, (name, param, layout)
                # FSDP on dim 1 over the ranks with the same experts, experts split on ep.
                assert layout["placements"][-2:] == ["Shard(dim=1)", "Shard(dim=0)"]
            else:
                assert layout["axes"] == dp_axes, (name, param, layout)


@pytest.mark.multiprocess
@pytest.mark.parametrize("which", ["ac_tp2", "ac_hsd2"])
def test_checkpointing_and_offloading_from_the_parameters(two, four, which) -> None:
    case = {"ac_tp2": two, "ac_hsd2": four}[which][which]
    variants = case["variants"]
    for variant, row in variants.items():
        assert row["loss_err_vs_single"] <= LOSS_BOUND, (variant, row)
    for variant in ("ac", "ac_every2", "selective", "selective_every2"):
        assert variants[variant]["grads_bit_identical"], variant
        assert variants[variant]["loss_diff_vs_plain"] == 0.0
    assert [variants[v]["checkpointed"] for v in ("plain", "ac", "ac_every2", "selective",
                                                  "selective_every2")] == [0, 4, 2, 4, 2]
    for variant in ("offload", "offload_native", "selective_offload"):
        row = variants[variant]
        print(f"{which}/{variant}: loss diff vs no offloading {row['loss_diff_vs_plain']:.1e}")
        assert row["loss_diff_vs_plain"] <= 1e-6, row
        assert row["blocks_offloaded"] == 4 * 3  # 4 blocks x 3 steps
    assert variants["offload"]["max_resident_blocks"] == 2  # activation_loading_horizon


@pytest.mark.multiprocess
@pytest.mark.parametrize("which", ["delayed_tp2", "delayed_tp2_hsd2"])
def test_delayed_init_under_tensor_parallelism(two, four, which) -> None:
    case = {"delayed_tp2": two, "delayed_tp2_hsd2": four}[which][which]
    assert case["q_halves_differ"]  # tp ranks drew different numbers for their shards
    assert case["bias_nonzero"] and case["tp_replicated_bias_agrees"]  # replicated: copied
    assert 0.05 < case["q_std"] < 0.2  # nn.Linear's U(-1/sqrt(32), 1/sqrt(32)): std 0.102
    assert case["finite_loss"]


@pytest.mark.multiprocess
def test_delayed_init_under_expert_parallelism(four) -> None:
    case = four["delayed_ep2"]
    assert case["expert_layer"] == "FSDPExpertParallelExperts"
    assert case["experts_distinct"]  # EP ranks and FSDP shards drew different numbers
    assert abs(case["expert_std"] - case["init_std"]) < 0.1 * case["init_std"]
    assert case["finite_loss"] and case["expert_grad_finite"]


@pytest.mark.multiprocess
def test_rank0_weights_under_expert_parallelism(four) -> None:
    case = four["rank0_ep2"]
    assert case["fsdp"]
    assert case["param_err"] == 0.0  # every rank's shards are rank 0's weights, bit for bit


@pytest.mark.multiprocess
def test_rank0_weights_under_tensor_parallelism_is_a_config_error(two) -> None:
    message = two["rank0_tp2"]["config_error"]
    assert "load_state_dict_from_rank0=True with tensor_parallel_degree=2" in message
    assert "load a sharded checkpoint after transform()" in message
