"""Context parallelism on 4 real gloo ranks vs one process (one torchrun launch; issue 31).

tests/runtime/workers/context_parallel.py trains a tiny HF Llama and a plain module calling
F.scaled_dot_product_attention under every layout of its LAYOUTS (cp2 over HSDP replicas, cp4,
cp2 inside a 4-rank shard group, cp2 x tp2 (also with sequence parallelism, the Llama only),
cp2 + activation checkpointing (full, with offloading, and selective); p2p, all_gather and a2a),
through both ways in
(the script splits rows with context_parallel_shard / HF labels=; forward_backward with full
rows and -100 targets), and reports every step's mean loss. The same launch runs Mistral, Qwen2
and GPT-NeoX through forward_backward, a save/load resume, SMP's FSDP1 flow and the refusals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.multiprocess

PARITY = 1e-5  # float32 mean loss per step over 3 AdamW steps, same seed and global batch
WORKER = Path(__file__).parent / "workers" / "context_parallel.py"
LAYOUTS = ["cp2_hsdp_p2p", "cp4_p2p", "cp2_dp2_shard4_p2p", "cp2_tp2_p2p",
           "cp2_checkpointing_p2p", "cp2_offloading_p2p", "cp2_selective_p2p", "cp2_all_gather",
           "cp2_a2a",
           "cp4_all_gather", "cp2_tp2_a2a"]
CP_SIZE = {"cp4_p2p": 4, "cp4_all_gather": 4}


@pytest.fixture(scope="module")
def records(torchrun) -> list[dict[str, Any]]:
    return torchrun(WORKER, 4, timeout=480)


def select(records: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    found = [r for r in records if all(r.get(k) == v for k, v in fields.items())]
    assert found, f"no record with {fields}"
    return found


@pytest.mark.parametrize("way", ["a", "b"])
@pytest.mark.parametrize("model", ["llama", "custom"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_steps_mean_loss_matches_one_process(records, layout, model, way) -> None:
    (ref,) = select(records, case="reference", model=model, way=way)
    rows = select(records, case="layout", layout=layout, model=model, way=way)
    assert len(rows) == 4
    for row in rows:
        errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
        assert max(errors) <= PARITY, (layout, model, way, row["rank"], errors)


def test_cp2_with_tp2_and_sequence_parallelism_matches_one_process(records) -> None:
    for way in ("a", "b"):
        (ref,) = select(records, case="reference", model="llama", way=way)
        rows = select(records, case="layout", layout="cp2_tp2_sp_p2p", model="llama", way=way)
        assert len(rows) == 4
        for row in rows:
            errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
            assert max(errors) <= PARITY, (way, row["rank"], errors)


@pytest.mark.parametrize("model", ["mistral", "qwen2", "gpt_neox"])
def test_other_hf_families_match_one_process(records, model) -> None:
    """Mistral (a window longer than the sequence), Qwen2, GPT-NeoX: forward_backward at cp2 x
    dp2; their rotary embeddings get the chunks' global positions."""
    (ref,) = select(records, case="reference", model=model, way="b")
    rows = select(records, case="layout", layout="cp2_dp2_shard4_p2p", model=model, way="b")
    assert len(rows) == 4
    for row in rows:
        errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
        assert max(errors) <= PARITY, (model, row["rank"], errors)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_backward_returns_the_rows_loss_on_every_cp_rank(records, layout) -> None:
    """Way (b): the cp ranks of one data-parallel rank return the same (whole rows') loss."""
    for model in ("llama", "custom"):
        by_dp: dict[int, set[float]] = {}
        for row in select(records, case="layout", layout=layout, model=model, way="b"):
            by_dp.setdefault(row["dp_rank"], set()).add(tuple(row["returned"]))
        assert all(len(values) == 1 for values in by_dp.values()), (layout, model, by_dp)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_cp_group_is_real_and_innermost_in_the_shard_group(records, layout) -> None:
    groups = select(records, case="groups", layout=layout)
    cp = CP_SIZE.get(layout, 2)
    for row in groups:
        assert row["cp_size"] == row["context_parallel_degree"] == cp
        assert len(row["cp_ranks"]) == cp and row["rank"] in row["cp_ranks"]
        assert row["cp_ranks"].index(row["rank"]) == row["cp_rank"]
        assert row["dp_size"] == 4 // (cp * (2 if "tp2" in layout else 1))
    expected = {(0, 1, 2, 3)} if cp == 4 else {(0, 1), (2, 3)}
    if "tp2" in layout:  # tp ranks are contiguous, the cp axis next
        expected = {(0, 2), (1, 3)}
    assert {tuple(r["cp_ranks"]) for r in groups} == expected


@pytest.mark.parametrize(("case", "quoted"), [
    ("a2a_heads", "cp_comm_type='a2a' (Ulysses) scatters attention heads over the 4 cp ranks, "
                  "but each rank has 2 query heads (2 % 4 = 2)"),
    ("odd_sequence", "sequence length 14 is not divisible by 8"),
    ("comm_type", "cp_comm_type='ring' is not one of 'p2p', 'all_gather', 'a2a'"),
    ("padding_mask", "attention_mask with masked (padding) positions"),
    ("sliding_window", "uses sliding-window attention (window 8) over a sequence of 16 tokens"),
])
def test_refusals_are_config_errors_with_the_arithmetic(records, case, quoted) -> None:
    (row,) = select(records, case=case)
    assert row["error"] is not None and quoted in row["error"], row


def test_smp_flow_with_fsdp1_and_labels_matches_one_process(records) -> None:
    """tsm.transform(cp_comm_type='all_gather'), FSDP1 over SMP's shard group (cp inside),
    the script's checkpoint wrappers, AWS's cp split and HF labels= (shifted globally)."""
    (ref,) = select(records, case="reference", model="llama", way="a")
    rows = select(records, case="smp")
    assert len(rows) == 4
    for row in rows:
        assert row["cp_size"] == row["context_parallel_degree"] == 2
        assert row["cp_rank"] == row["rank"] % 2
        errors = [abs(a - b) for a, b in zip(row["losses"], ref["losses"], strict=True)]
        assert max(errors) <= PARITY, (row["rank"], errors)
    refused = select(records, case="smp_comm_type")
    assert all("tsm.transform(cp_comm_type='ring')" in r["error"] for r in refused)


RESUME = 1e-6


def test_a_resumed_run_has_the_losses_of_an_uninterrupted_one(records) -> None:
    """cp2 x dp2 (shard 4), Llama, forward_backward: save_checkpoint after step 0, a fresh
    model and optimizer load it, steps 1-2 match the uninterrupted run's (1e-6)."""
    whole = select(records, case="layout", layout="cp2_dp2_shard4_p2p", model="llama", way="b")
    resumed = select(records, case="resume", layout="cp2_dp2_shard4_p2p")
    assert len(resumed) == 4
    for row in resumed:
        errors = [abs(a - b) for a, b in zip(row["losses"], whole[0]["losses"], strict=True)]
        assert max(errors) <= RESUME, (row["rank"], errors)
