"""tp 2 x hybrid 2 (8 ranks) -> full shard on 2 ranks and -> one process, within 1e-5.

One 8-rank torchrun launch trains two AdamW steps of the tiny Llama on tensor parallelism 2 x
2 replicas x shard 2 and saves; a 2-rank launch and this process resume it on full sharding
and train two more steps. Both must match one uninterrupted process (same seed, same global
batch) within 1e-5 float32 loss.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

WORKERS = Path(__file__).parent / "workers"
sys.path.insert(0, str(WORKERS))
import ckpt_support as support  # noqa: E402

from meshtrain_runtime.checkpoint import MARKER_NAME  # noqa: E402

TOLERANCE = 1e-5
AFTER = slice(support.STEPS_BEFORE, support.STEPS_BEFORE + support.STEPS_AFTER)
pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def launches(torchrun, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tp_hybrid")
    saved = torchrun(WORKERS / "ckpt_reshard8.py", 8, "save", str(root), timeout=600)
    loaded = torchrun(WORKERS / "ckpt_reshard8.py", 2, "load", str(root), timeout=300)
    cases = {record["case"]: record for record in saved + loaded}
    return {"root": root, "cases": cases, "reference": support.reference_losses()}


def _case(launches: dict[str, Any], name: str) -> dict[str, Any]:
    record = launches["cases"][name]
    assert "error" not in record, record["error"]
    return record


def _max_error(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(losses, reference, strict=True))


def test_tp2_hybrid2_trains_like_one_process_and_saves(launches):
    record = _case(launches, "save_tp2_hybrid2")
    assert (record["tp_size"], record["replicate"], record["shard"], record["dp_size"]) == (
        2, 2, 2, 4)
    assert _max_error(record["losses"], launches["reference"][: support.STEPS_BEFORE]) < TOLERANCE
    saved = Path(record["saved"])
    assert (saved / MARKER_NAME).is_file()
    assert {f"__{rank}_0.distcp" for rank in range(8)} <= {p.name for p in saved.iterdir()}


def test_tp2_hybrid2_resumes_on_full_shard_of_two_ranks(launches):
    record = _case(launches, "tp2_hybrid2_to_full_shard_2")
    assert record["step"] == support.STEPS_BEFORE
    assert record["rng_restored"] is False  # another world size
    error = _max_error(record["losses"], launches["reference"][AFTER])
    print(f"tp2 x hybrid2 -> full shard 2: max loss error {error:.2g}")
    assert error < TOLERANCE


def test_tp2_hybrid2_resumes_in_one_process(launches, single_process_runtime):
    record = support.load_and_continue(support.FULL_SHARD, launches["root"] / "tp2_hybrid2")
    assert single_process_runtime.world_size == 1
    error = _max_error(record["losses"], launches["reference"][AFTER])
    print(f"tp2 x hybrid2 -> one process: max loss error {error:.2g}")
    assert error < TOLERANCE
