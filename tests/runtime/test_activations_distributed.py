"""Activation checkpointing and offloading under hybrid 2x2, tp=2 x fsdp=2 and tp=2 (4 ranks).

One torchrun launch (tests/runtime/workers/ac_parity.py) runs every layout and variant; each rank
reports its comparisons against a single-process run of the same model, seed and global batch
and against the same layout without checkpointing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

WORKERS = Path(__file__).parent / "workers"

LAYOUTS = ("hsdp_2x2", "tp2_fsdp2", "tp2")
CHECKPOINTED = ("ac", "ac_every2", "selective", "selective_every2")
OFFLOADED = ("offload", "offload_native", "selective_offload")


@pytest.fixture(scope="module")
def records(torchrun: Any) -> list[dict[str, Any]]:
    return torchrun(WORKERS / "ac_parity.py", 4, timeout=420)


def by_case(records: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    found = [r for r in records if r["case"] == case]
    assert len(found) == 4, f"{case}: expected one record per rank, got {len(found)}"
    return found


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_matches_single_process(records: list[dict[str, Any]], layout: str) -> None:
    for variant in ("plain", *CHECKPOINTED, *OFFLOADED):
        for record in by_case(records, f"{layout}/{variant}"):
            assert record["loss_diff_vs_single"] <= 1e-5, (variant, record)
            # Gradients of O(1) summed in another order across ranks: float32 rounding only.
            assert record["grad_diff_vs_single"] <= 5e-5, (variant, record)


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", LAYOUTS)
def test_checkpointing_gradients_bit_identical(records: list[dict[str, Any]], layout: str) -> None:
    for variant in CHECKPOINTED:
        for record in by_case(records, f"{layout}/{variant}"):
            assert record["grads_bit_identical_to_plain"], (variant, record)
            assert record["loss_diff_vs_plain"] == 0.0


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", LAYOUTS)
def test_offloading_loss_parity(records: list[dict[str, Any]], layout: str) -> None:
    for variant in OFFLOADED:
        for record in by_case(records, f"{layout}/{variant}"):
            if record["rank"] == 0:
                print(f"{layout}/{variant}: losses {record['losses']}, "
                      f"|diff| vs no offloading {record['loss_diff_vs_plain']:.2e}")
            assert record["loss_diff_vs_plain"] <= 1e-6, (variant, record)
            assert record["grads_bit_identical_to_plain"], (variant, record)
            assert record["blocks_offloaded"] == 4 * 2  # 4 blocks x 2 steps
    for variant in ("offload", "selective_offload"):
        for record in by_case(records, f"{layout}/{variant}"):
            assert record["max_resident_blocks"] == 2  # the horizon


@pytest.mark.multiprocess
def test_dtensor_inputs_offloaded_without_changing_gradients(
    records: list[dict[str, Any]],
) -> None:
    plain = by_case(records, "dtensor_input/none")
    for variant in ("offload", "offload_native"):
        for record, reference in zip(by_case(records, f"dtensor_input/{variant}"), plain,
                                     strict=True):
            assert record["tensors_offloaded"] == 3  # one DTensor input per block
            assert record["grads"] == reference["grads"]
