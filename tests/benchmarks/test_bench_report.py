"""`make bench`'s aggregation (benchmarks/report.py) on hand-made inputs, and its smoke run.

The unit tests check the arithmetic (medians, quartiles, ratios vs theory, goals, the markdown
table) without timing anything. The smoke test runs benchmarks/run_all.py --smoke: a tiny model
in full shard and tp on 2 gloo ranks, end to end, into a temporary directory; it asserts the
shape and the exact (machine-independent) figures: parameter bytes and collective bytes equal
theory, and both sides train DTensors only (the hand-written tp replicates its norms as
transform() does, so AdamW's foreach path, CUDA's default, would accept either).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402


def _raw(name: str, ratios: list[float], **overrides) -> dict:
    raw = {
        "layout": name, "ranks": 4, "parameters": {},
        "mesh": {"replicate": 1, "shard": 4, "tp": 1},
        "round_ratios": ratios,
        "step_ms": {"transform": 10.0, "by_hand": 9.0},
        "memory": {"transform_bytes": 1100, "by_hand_bytes": 1000, "theory_bytes": 1000},
        "collective_bytes": {
            "transform": {"forward/all_gather": 300, "backward/reduce_scatter": 300},
            "by_hand": {"forward/all_gather": 300, "backward/reduce_scatter": 300},
            "theory": {"forward/all_gather": 200, "backward/reduce_scatter": 200},
        },
    }
    raw.update(overrides)
    return raw


def test_summarize_ratios_median_and_quartiles() -> None:
    summary = report.summarize_ratios([1.4, 1.0, 1.2, 0.8, 1.1])
    assert summary["median"] == pytest.approx(1.1)
    assert summary["q1"] == pytest.approx(1.0)  # inclusive quartiles of 0.8 1.0 1.1 1.2 1.4
    assert summary["q3"] == pytest.approx(1.2)
    assert (summary["min"], summary["max"], summary["n"]) == (0.8, 1.4, 5)
    single = report.summarize_ratios([0.97])
    assert single["q1"] == single["q3"] == single["median"] == 0.97
    with pytest.raises(ValueError):
        report.summarize_ratios([])


def test_layout_entry_ratios_against_theory_and_by_hand() -> None:
    entry = report.layout_entry(_raw("hybrid", [1.0, 1.02, 0.98]))
    assert entry["overhead_ratio"] == pytest.approx(1.0)
    assert entry["overhead_spread"]["n"] == 3
    assert entry["memory"]["over_theory"] == pytest.approx(1.1)
    assert entry["memory"]["over_by_hand"] == pytest.approx(1.1)
    assert entry["collectives"]["transform_bytes"] == 600
    assert entry["collectives"]["over_theory"] == pytest.approx(1.5)
    assert entry["collectives"]["over_by_hand"] == pytest.approx(1.0)


def test_missing_collective_theory_is_none_not_zero() -> None:
    raw = _raw("ep", [1.0], collective_bytes={"theory": None})
    entry = report.layout_entry(raw)
    assert entry["collectives"]["theory_bytes"] is None
    assert entry["collectives"]["over_theory"] is None
    assert "| ep | 4 | 1.000 |" in report.render_markdown(
        report.build_report([raw], machine={"description": "m"}))


def test_cpu_time_ratios_are_summarised_beside_the_wall_clock_ones() -> None:
    raw = _raw("tp", [1.04, 1.06, 1.05], cpu_round_ratios=[0.99, 1.01, 1.0, 1.02, 0.98])
    entry = report.layout_entry(raw)
    assert entry["overhead_ratio"] == pytest.approx(1.05)  # the goal stays on wall time
    assert entry["cpu_overhead_ratio"] == pytest.approx(1.0)
    assert entry["cpu_overhead_spread"]["n"] == 5
    assert entry["cpu_overhead_spread"]["q1"] == pytest.approx(0.99)
    result = report.build_report([raw], machine={"description": "box"})
    assert result["goals_met"]["overhead_ratio_le_1.03"] is False
    assert "| tp | 4 | 1.050 | 1.045..1.055 | 1.000 (0.990..1.010) |" in \
        report.render_markdown(result)
    old = report.layout_entry(_raw("tp", [1.0]))  # a record from before CPU time was measured
    assert old["cpu_overhead_ratio"] is None and old["cpu_overhead_spread"] is None


def test_launch_entry_pairs_ratios() -> None:
    launch = report.launch_entry([11.0, 12.0, 9.0], [10.0, 10.0, 10.0])
    assert launch["overhead_ratio"] == pytest.approx(1.1)
    assert launch["median_fit_s"] == 11.0
    with pytest.raises(ValueError):
        report.launch_entry([1.0], [1.0, 2.0])


def test_goals_and_markdown() -> None:
    ok = report.build_report([_raw("full_shard", [1.0, 1.01])], machine={"description": "box"},
                             launch=report.launch_entry([1.1], [1.0]))
    assert ok["goals_met"] == {"overhead_ratio_le_1.03": True, "launch_le_1.2": True}
    slow = report.build_report([_raw("full_shard", [1.05, 1.06]), _raw("tp", [1.0])],
                               machine={"description": "box"},
                               launch=report.launch_entry([1.5], [1.0]))
    assert slow["goals_met"] == {"overhead_ratio_le_1.03": False, "launch_le_1.2": False}
    table = report.render_markdown(slow)
    assert "Machine: box" in table
    assert "| full_shard | 4 | 1.055 | 1.053..1.058 | - | 10.0 / 9.0 | 1.1000 | 1.5000 |" in table
    assert "fit() / raw torchrun = 1.500" in table


def test_a_null_layout_is_reported_as_the_floor_not_held_to_the_goal() -> None:
    result = report.build_report([_raw("null_full_shard", [1.2, 1.3], null=True),
                                  _raw("full_shard", [1.0, 1.02])],
                                 machine={"description": "box"})
    assert result["layouts"]["null_full_shard"]["null"] is True
    assert result["layouts"]["full_shard"]["null"] is False
    assert result["goals_met"]["overhead_ratio_le_1.03"] is True
    assert "| null_full_shard (hand-written vs itself) | 4 | 1.250 |" in \
        report.render_markdown(result)
    over = report.build_report([_raw("null_full_shard", [1.0], null=True),
                                _raw("full_shard", [1.1])], machine={"description": "box"})
    assert over["goals_met"]["overhead_ratio_le_1.03"] is False


def test_tp_and_ep_entries() -> None:
    tp = {"results": {"sp": {"meshtrain": {"ring_bytes_per_rank": 90},
                             "torch": {"ring_bytes_per_rank": 90},
                             "expected": {"ring_bytes_per_rank": 100}}}}
    assert report.tp_comm_entry(tp)["sp"]["over_theory"] == pytest.approx(0.9)
    ep = report.ep_comm_entry({"measured_bytes_per_step": 5.0, "theoretical_bytes_per_step": 5.0,
                               "measured_over_theoretical": 1.0})
    assert ep["over_theory"] == 1.0


@pytest.mark.multiprocess
def test_smoke_run_end_to_end(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--smoke", "--out", str(tmp_path),
         "--machine", "test"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "latest.json").read_text())
    entry = result["layouts"]["full_shard"]
    assert entry["ranks"] == 2 and entry["overhead_spread"]["n"] == 2
    assert entry["overhead_ratio"] > 0
    assert entry["cpu_overhead_spread"]["n"] == 2 and entry["cpu_overhead_ratio"] > 0
    # Byte figures do not depend on the machine: FSDP2 moves exactly what theory says.
    assert entry["memory"]["transform_bytes"] == entry["memory"]["by_hand_bytes"]
    assert entry["memory"]["over_theory"] == 1.0
    assert entry["collectives"]["over_theory"] == 1.0
    assert entry["collectives"]["over_by_hand"] == 1.0
    assert "| full_shard | 2 |" in (tmp_path / "latest.md").read_text()
    tp = result["layouts"]["tp"]
    assert tp["mesh"]["tp"] == 2 and tp["memory"]["over_by_hand"] == 1.0
    for layout in (entry, tp):
        assert layout["plain_parameters"] == {"transform": 0, "by_hand": 0}, layout
