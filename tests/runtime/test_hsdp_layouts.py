"""Sharded data parallelism on real gloo ranks vs a single process (one launch per world size).

Each world size runs tests/runtime/workers/hsdp_layouts.py once (2 ranks ~10 s, 4 ranks ~25 s);
the tests below assert on its records: loss and clip parity for every layout on a tiny HF Llama
and a custom module, placements, replica agreement, memory accounting, delayed init, loading from
rank 0, state coordinates, and errors.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.multiprocess

PARITY = 1e-5  # float32 loss, same seed and global batch (house rule)
CLIP = 0.05
LAYOUTS = {
    2: ["full_shard"],
    4: ["full_shard", "hybrid_2x2", "no_shard", "shard_grad_op"],
}
WORKER = Path(__file__).parent / "workers" / "hsdp_layouts.py"
SHARD_DEGREE = {"full_shard": None, "hybrid_2x2": 2, "no_shard": 1, "shard_grad_op": None}


@pytest.fixture(scope="module")
def run2(torchrun) -> tuple[int, list[dict[str, Any]]]:
    return 2, torchrun(WORKER, 2, timeout=300)


@pytest.fixture(scope="module")
def run4(torchrun) -> tuple[int, list[dict[str, Any]]]:
    """Also runs the delayed-initialisation cases (tests at the end of this file)."""
    return 4, torchrun(WORKER, 4, timeout=420)


@pytest.fixture(params=["run2", "run4"], ids=["2ranks", "4ranks"])
def run(request: pytest.FixtureRequest) -> tuple[int, list[dict[str, Any]]]:
    return request.getfixturevalue(request.param)


def select(records: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    found = [r for r in records if all(r.get(k) == v for k, v in fields.items())]
    assert found, f"no record with {fields}"
    return found


def reference(records: list[dict[str, Any]], model: str, clip: float | None) -> dict[str, Any]:
    (ref,) = select(records, case="reference", model=model, clip=clip)
    return ref


@pytest.mark.parametrize("clip", [None, CLIP], ids=["plain", "clipped"])
@pytest.mark.parametrize("model", ["llama", "custom"])
def test_loss_parity_with_one_process(run, model: str, clip: float | None) -> None:
    world, records = run
    ref = reference(records, model, clip)
    for layout in LAYOUTS[world]:
        rows = select(records, case="layout", layout=layout, model=model, clip=clip)
        assert len(rows) == world
        for row in rows:
            errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
            assert max(errors) <= PARITY, (layout, row["rank"], errors)


@pytest.mark.parametrize("model", ["llama", "custom"])
def test_clip_grad_norm_matches_torch_on_one_process(run, model: str) -> None:
    world, records = run
    ref = reference(records, model, CLIP)
    unclipped = reference(records, model, None)
    assert min(ref["norms"]) > CLIP  # every step really clips
    assert ref["losses"] != unclipped["losses"]  # and clipping changes training
    for layout in LAYOUTS[world]:
        for row in select(records, case="layout", layout=layout, model=model, clip=CLIP):
            for norm, expected in zip(row["norms"], ref["norms"], strict=True):
                assert norm == pytest.approx(expected, rel=1e-5), (layout, row["rank"])


def test_grad_norm_of_every_order_matches_the_gathered_gradients(run) -> None:
    world, records = run
    rows = select(records, case="norm_types")
    assert {r["layout"] for r in rows} == set(LAYOUTS[world])
    for row in rows:
        assert set(row["relative_errors"]) == {"1.0", "2.0", "inf"}
        assert max(row["relative_errors"].values()) <= 1e-6, row


def test_placements_follow_the_mesh_axes(run) -> None:
    world, records = run
    expected = {
        "full_shard": [[["shard"], [world], ["S(0)"]]],
        "shard_grad_op": [[["shard"], [world], ["S(0)"]]],
        "hybrid_2x2": [[["replicate", "shard"], [2, 2], ["R", "S(0)"]]],
        "no_shard": [[["replicate", "shard"], [world, 1], ["R", "S(0)"]]],
    }
    for layout in LAYOUTS[world]:
        for row in select(records, case="layout", layout=layout):
            assert row["plain"] == [], "every parameter must be a DTensor"
            assert row["layouts"] == expected[layout], (layout, row["model"])


def test_replicas_agree_and_shards_differ(run) -> None:
    """After 5 steps: ranks with one shard coordinate hold identical shards, others differ."""
    world, records = run
    for layout in LAYOUTS[world]:
        for model in ("llama", "custom"):
            rows = select(records, case="layout", layout=layout, model=model, clip=None)
            by_shard: dict[int, set[float]] = {}
            for row in rows:
                by_shard.setdefault(row["shard_rank"], set()).add(row["local_sum"])
            assert all(len(sums) == 1 for sums in by_shard.values()), (layout, by_shard)
            distinct = {next(iter(sums)) for sums in by_shard.values()}
            assert len(distinct) == len(by_shard), (layout, by_shard)
            assert len(by_shard) == (SHARD_DEGREE[layout] or world)


def test_memory_per_rank_is_total_over_shard_degree(run) -> None:
    """Parameters, gradients and Adam moments: total / shard degree per rank (1 % + padding).

    With uneven dims FSDP chunks like torch.chunk: a rank holds at most `padding_bound` bytes
    above the exact share, and the last rank up to (shard - 1) times that below it.
    """
    world, records = run
    for layout in LAYOUTS[world]:
        for row in select(records, case="layout", layout=layout, clip=None):
            shard = SHARD_DEGREE[layout] or world
            assert row["shard_degree"] == shard
            memory = row["memory"]
            share = memory["param_total"] / shard
            above = 0.01 * share + memory["padding_bound"]
            below = 0.01 * share + (shard - 1) * memory["padding_bound"]
            for key, factor in (("param_local", 1), ("grad_local", 1), ("adam_local", 2)):
                assert -factor * below <= memory[key] - factor * share <= factor * above, (
                    layout, key, memory
                )
            assert memory["param_storage"] <= share + above


def test_shards_of_one_replica_add_up_to_the_model(run) -> None:
    world, records = run
    for layout in LAYOUTS[world]:
        for model in ("llama", "custom"):
            rows = select(records, case="layout", layout=layout, model=model, clip=None)
            replica = [r["memory"] for r in rows if r["replicate_rank"] == 0]
            assert len(replica) == (SHARD_DEGREE[layout] or world)
            for key in ("param_local", "grad_local"):
                assert sum(m[key] for m in replica) == replica[0]["param_total"], (layout, key)


def test_padding_is_exercised_by_the_custom_model(run) -> None:
    _, records = run
    row = select(records, case="layout", layout="full_shard", model="custom", clip=None)[0]
    assert row["memory"]["padding_bound"] > 0  # width 51 is odd: uneven shards


def test_reshard_after_forward_per_strategy(run) -> None:
    world, records = run
    for layout in LAYOUTS[world]:
        row = select(records, case="layout", layout=layout, model="llama", clip=None)[0]
        flags = row["reshard_after_forward"]
        # groups in module order: embedding, the 2 decoder layers, then the output head
        if layout in ("full_shard", "hybrid_2x2"):
            assert flags == [True, True, True, False], layout
        else:
            assert flags == [False, False, False, False], layout
        assert row["strategy"] == {"hybrid_2x2": "hybrid_shard"}.get(layout, layout)


def test_degree_that_does_not_divide_the_world(run) -> None:
    world, records = run
    for row in select(records, case="bad_degree"):
        assert row["type"] == "ConfigError"
        assert "hybrid_shard_degree=3 does not divide the data-parallel size" in row["error"]
        assert f"world size {world} (1 host x {world} processes)" in row["error"]
        assert {2: "Use 1 or 2,", 4: "Use 1, 2 or 4,"}[world] in row["error"]


def test_state_coordinates_and_groups(run) -> None:
    world, records = run
    for row in select(records, case="state"):
        rank, layout = row["rank"], row["layout"]
        mesh = row["mesh"]
        assert mesh["names"] == ["replicate", "shard", "tp"]
        assert math.prod(mesh["shape"]) == world
        assert mesh["coordinate"] == [row["replicate_rank"], row["shard_rank"], row["tp_rank"]]
        assert row["world_group"] == list(range(world))
        tp = row["tp_size"]
        assert row["tp_group"] == [rank - rank % tp + i for i in range(tp)]
        assert row["dp_rank"] == rank // (tp * row["cp_size"])
        assert row["dp_size"] == world // (tp * row["cp_size"])
        replica = world // row["replicate_degree"]
        start = rank - rank % replica
        assert row["rep_rank_group"] == list(range(start, start + replica))
        _check_expert_layout(row, world)
        assert row["random_seed"] == (5 if layout == "tp2" and world == 4 else None)
        # The custom model has no tensor-parallel plan and no MoE layers: each is a ConfigError
        # raised before the model is touched (cp2 transforms it: test_context_parallel.py).
        expected = {
            "tp2": "TinyLM declares no tensor-parallel plan",
            "ep2": "expert_parallel_degree=2 but TinyLM has no mixture-of-experts layers",
            "hybrid_ep2": "expert_parallel_degree=2 but TinyLM has no mixture-of-experts layers",
        }.get(layout)
        if expected is None:
            assert row["transform_error"] is None
        else:
            assert expected in row["transform_error"]
            assert row["model_untouched"]


def _check_expert_layout(row: dict[str, Any], world: int) -> None:
    ep = row["ep_size"]
    if ep == 1:
        assert row["expert_mesh"] is None and row["ep_group"] is None
        return
    expert = row["expert_mesh"]
    assert expert["names"] == ["replicate", "shard_mod_ep", "ep"]
    assert expert["shape"] == [row["replicate_degree"], row["hybrid_shard_degree"] // ep, ep]
    assert expert["coordinate"][2] == row["ep_rank"] == row["shard_rank"] % ep
    rank = row["rank"]
    assert row["ep_group"] == [rank - rank % ep + i for i in range(ep)]  # innermost, contiguous
    assert row["dp_size"] == world  # EP ranks are data-parallel ranks


# --- delayed initialisation (4 ranks) ---


def test_meta_llama_is_never_materialised_whole(run4) -> None:
    _, records = run4
    for row in select(records, case="meta_llama"):
        shard = row["shard_degree"]
        share = row["full_bytes"] / shard
        assert row["local_bytes"] == pytest.approx(share, rel=0.01)
        # peak of live storages created during transform(): this rank's shard plus the rotary
        # buffers, far from the whole model (11.5 MB)
        assert row["peak_bytes"] <= 1.01 * share, row
        assert row["peak_bytes"] < row["full_bytes"] / shard + 0.05 * row["full_bytes"]


def test_meta_llama_is_initialised_like_hf(run4) -> None:
    _, records = run4
    for row in select(records, case="meta_llama"):
        std = row["initializer_range"]
        assert row["q_proj_std"] == pytest.approx(std, rel=0.05)
        assert row["embed_std"] == pytest.approx(std, rel=0.05)
        assert not row["q_proj_halves_equal"]  # shards drew different numbers
        assert row["norm_min"] == row["norm_max"] == 1.0
        assert row["inv_freq_error"] == 0.0  # the non-persistent rotary buffer is recomputed
        assert row["pad_row_abs_max"] == 0.0  # padding row zeroed on the shard that holds it
        assert row["other_rows_min_abs_max"] > 0.0
        assert row["losses"][0] == pytest.approx(math.log(1024), abs=0.15)
        assert row["losses"][-1] < row["losses"][0]  # it trains


def test_meta_llama_replicas_agree(run4) -> None:
    _, records = run4
    for layout in ("full_shard", "hybrid_2x2"):
        rows = select(records, case="meta_llama", layout=layout)
        by_shard: dict[int, set[float]] = {}
        for row in rows:
            by_shard.setdefault(row["shard_rank"], set()).add(row["local_sum"])
        assert all(len(sums) == 1 for sums in by_shard.values()), by_shard
        assert len({next(iter(s)) for s in by_shard.values()}) == len(by_shard)


def test_meta_custom_model_uses_reset_parameters(run4) -> None:
    _, records = run4
    for row in select(records, case="meta_custom"):
        assert row["peak_bytes"] <= 1.01 * row["full_bytes"] / row["shard_degree"]
        assert 0 < row["up_max_abs"] <= row["up_bound"]  # kaiming-uniform bound of nn.Linear
        assert row["norm_weight_ones"] and row["norm_bias_zeros"]
        assert row["embed_std"] == pytest.approx(1.0, rel=0.05)  # nn.Embedding: N(0, 1)


def test_load_state_dict_from_rank0(run4) -> None:
    _, records = run4
    ref = reference(records, "llama", None)
    for row in select(records, case="rank0_load"):
        assert row["weight_error"] == 0.0 and row["buffers_error"] == 0.0
        assert row["local_bytes"] == row["full_bytes"] // row["shard_degree"]
        errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
        assert max(errors) <= PARITY, (row["layout"], errors)


def test_rank0_on_meta_fails_on_every_rank(run4) -> None:
    _, records = run4
    rows = select(records, case="rank0_on_meta")
    assert len(rows) == 4
    for row in rows:
        assert "rank 0's model has parameters on the meta device" in row["error"]


def test_fp8_with_float8_all_gather_matches_one_process_of_the_same_micro_batches(run4) -> None:
    """fp8 full shard and hybrid 2x2 vs one process that runs each rank's rows as its own
    micro-batch (float8 scales each matmul input by its own amax: see workers/hsdp_fp8.py)."""
    _, records = run4
    skipped = [r["skipped"] for r in records if r["case"] == "fp8" and "skipped" in r]
    if skipped:
        pytest.skip(skipped[0])
    (fp8_reference,) = select(records, case="fp8_reference")
    fp32 = reference(records, "llama", None)
    for layout in ("full_shard", "hybrid_2x2"):
        rows = select(records, case="fp8", layout=layout)
        assert len(rows) == 4
        for row in rows:
            assert row["linear_type"] == "Float8Linear"
            # sharded weights are cast to float8 before FSDP2's all-gather
            assert row["weight_type"] == "WeightWithDynamicFloat8CastTensor"
            errors = [abs(a - b) for a, b in
                      zip(row["losses"], fp8_reference["losses"], strict=True)]
            assert max(errors) <= PARITY, (layout, errors)
            # float8 rounding (3 mantissa bits) moves the loss a little from fp32's (measured
            # 3.0e-4 relative at most over the 5 steps), not more
            assert row["losses"] == pytest.approx(fp32["losses"], rel=2e-3)
            assert row["losses"] != pytest.approx(fp32["losses"], abs=1e-7)
    # its checkpoint (float8 weights are saved as their high-precision values) resumes on
    # another layout
    for row in select(records, case="fp8_resume"):
        assert row["loaded"] == pytest.approx(row["expected"], abs=PARITY)
