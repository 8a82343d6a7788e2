"""`make bench`'s aggregation (benchmarks/report.py) on hand-made inputs, and its smoke run.

The unit tests check the arithmetic (medians, quartiles, ratios vs theory, floors, goals that
need the wall-clock AND the CPU-time ratio, the markdown table) without timing anything, and
the fairness of the baselines that can be read without running them: the hand-written ep
imports no meshtrain code, a full run takes at least 10 interleaved pairs. The smoke test runs
benchmarks/run_all.py --smoke: a tiny model in the null layout, full shard, tp and ep on 2 gloo
ranks, end to end, into a temporary directory; it asserts the shape and the exact
(machine-independent) figures: parameter and collective bytes equal theory, both sides compute
the same first-step loss (the same work), the hand-written tp keeps its norms plain, the
hand-written ep is built from the benchmark's own all-to-all module and no meshtrain class, and
every layout carries its wall and CPU ratio beside the null layout of the same run.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import run_all  # noqa: E402


def _raw(name: str, ratios: list[float], **overrides) -> dict:
    raw = {
        "layout": name, "ranks": 4, "parameters": {},
        "mesh": {"replicate": 1, "shard": 4, "tp": 1},
        "round_ratios": ratios,
        "cpu_round_ratios": ratios,
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
    assert "| ep | 4 | 1.000 (1.000..1.000) |" in report.render_markdown(
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
    assert "| tp | 4 | 1.050 (1.045..1.055) | 1.000 (0.990..1.010) | - | **no** |" in \
        report.render_markdown(result)
    old = report.layout_entry(_raw("tp", [1.0], cpu_round_ratios=None))  # before CPU time
    assert old["cpu_overhead_ratio"] is None and old["cpu_overhead_spread"] is None
    assert report.within_goal(old, 1.03) is False  # a goal needs both ratios


def test_the_goal_needs_both_the_wall_clock_and_the_cpu_time_ratio() -> None:
    cpu_over = _raw("tp", [1.0, 1.01], cpu_round_ratios=[1.05, 1.06])
    wall_over = _raw("hybrid", [1.05, 1.06], cpu_round_ratios=[1.0, 1.01])
    both = _raw("full_shard", [1.0, 1.01], cpu_round_ratios=[1.0, 1.02])
    for raw, met in ((cpu_over, False), (wall_over, False), (both, True)):
        result = report.build_report([raw], machine={"description": "box"})
        assert result["layouts"][raw["layout"]]["goal_met"] is met
        assert result["goals_met"]["overhead_ratio_le_1.03"] is met


def _launch(fit: list[float], torchrun: list[float], *, cpu_factor: float = 1.0) -> dict:
    return {"fit_s": fit, "torchrun_s": torchrun, "null_s": [t * 1.01 for t in torchrun],
            "fit_cpu_s": [f * cpu_factor for f in fit], "torchrun_cpu_s": torchrun,
            "null_cpu_s": torchrun}


def test_launch_entry_pairs_ratios_with_cpu_time_and_its_floor() -> None:
    launch = report.launch_entry(_launch([11.0, 12.0, 9.0], [10.0, 10.0, 10.0],
                                         cpu_factor=1.5))
    assert launch["overhead_ratio"] == pytest.approx(1.1)
    assert launch["cpu_overhead_ratio"] == pytest.approx(1.65)
    assert launch["floor"]["overhead_ratio"] == pytest.approx(1.01)
    assert launch["floor"]["cpu_overhead_ratio"] == pytest.approx(1.0)
    assert launch["median_fit_s"] == 11.0
    # wall within 1.2 but CPU time not: the launch goal fails
    assert report.within_goal(launch, report.LAUNCH_GOAL) is False
    with pytest.raises(ValueError):
        report.launch_entry(_launch([1.0], [1.0, 2.0]))


def test_goals_and_markdown() -> None:
    ok = report.build_report([_raw("full_shard", [1.0, 1.01])], machine={"description": "box"},
                             launch=report.launch_entry(_launch([1.1], [1.0])))
    assert ok["goals_met"] == {"overhead_ratio_le_1.03": True, "launch_le_1.2": True}
    slow = report.build_report([_raw("full_shard", [1.05, 1.06]), _raw("tp", [1.0])],
                               machine={"description": "box"},
                               launch=report.launch_entry(_launch([1.5], [1.0])))
    assert slow["goals_met"] == {"overhead_ratio_le_1.03": False, "launch_le_1.2": False}
    table = report.render_markdown(slow)
    assert "Machine: box" in table
    assert ("| full_shard | 4 | 1.055 (1.053..1.058) | 1.055 (1.053..1.058) | - | **no** | "
            "10.0 / 9.0 | 1.1000 | 1.5000 |") in table
    assert "| tp | 4 | 1.000 (1.000..1.000) | 1.000 (1.000..1.000) | - | yes |" in table
    assert "wall 1.500 (1.500..1.500), CPU 1.500 (1.500..1.500); floor (torchrun / " \
        "torchrun) wall 1.010, CPU 1.000" in table


def test_a_null_layout_is_reported_as_the_floor_not_held_to_the_goal() -> None:
    result = report.build_report([_raw("null_full_shard", [1.2, 1.3], null=True),
                                  _raw("full_shard", [1.0, 1.02])],
                                 machine={"description": "box"})
    assert result["layouts"]["null_full_shard"]["null"] is True
    assert result["layouts"]["full_shard"]["null"] is False
    assert result["goals_met"]["overhead_ratio_le_1.03"] is True
    floor = result["layouts"]["full_shard"]["floor"]
    assert floor["layout"] == "null_full_shard" and floor["overhead_ratio"] == pytest.approx(1.25)
    assert result["layouts"]["null_full_shard"]["floor"] is None
    assert "| null_full_shard (hand-written vs itself) | 4 | 1.250 (1.225..1.275) |" in \
        report.render_markdown(result)
    assert "| 1.250 / 1.250 | yes |" in report.render_markdown(result)
    eight = report.build_report([_raw("null_full_shard", [1.0], null=True),
                                 _raw("tp_x_hybrid", [1.0], ranks=8)],
                                machine={"description": "box"})
    assert eight["layouts"]["tp_x_hybrid"]["floor"] is None  # a floor of the same rank count
    over = report.build_report([_raw("null_full_shard", [1.0], null=True),
                                _raw("full_shard", [1.1])], machine={"description": "box"})
    assert over["goals_met"]["overhead_ratio_le_1.03"] is False


def test_load_average_at_both_ends_and_a_loaded_machine_said_so() -> None:
    quiet = report.machine_lines({"description": "vm", "cpus": 2, "load_start": [0.5, 0.4, 0.3],
                                  "load_end": [1.0, 0.6, 0.4], "loaded": False})
    assert "0.50 / 0.40 / 0.30 at the start, 1.00 / 0.60 / 0.40 at the end" in quiet[1]
    assert len(quiet) == 2
    loaded = report.machine_lines({"description": "vm", "cpus": 2, "load_start": [6.0, 5, 4],
                                   "load_end": [7.0, 6, 5], "loaded": True})
    assert loaded[2].startswith("**Loaded machine**")
    assert run_all.is_loaded([6.0, 5.0, 4.0], [1.0, 1.0, 1.0], cpus=2)  # 6 runnable > 2 CPUs
    assert not run_all.is_loaded([1.5, 5.0, 4.0], [2.0, 1.0, 1.0], cpus=2)
    assert not run_all.is_loaded(None, None, cpus=2)


def test_a_full_run_takes_at_least_ten_interleaved_pairs() -> None:
    args = run_all.parse_args([])
    assert args.rounds >= 10 and args.launch_pairs >= 10 and not args.smoke
    for few in (["--launch-pairs", "3"], ["--rounds", "9"]):
        with pytest.raises(SystemExit):
            run_all.parse_args(few)
    assert run_all.parse_args(["--smoke", "--launch-pairs", "1"]).smoke
    # every launch of a full run starts with its own floor
    assert run_all.FULL_4.startswith("null_") and run_all.FULL_8.startswith("null_")


def test_the_hand_written_ep_imports_no_meshtrain_code() -> None:
    tree = ast.parse((BENCH / "ep_by_hand.py").read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and all(name.split(".")[0] in {"__future__", "typing", "torch"}
                            for name in imported), imported
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert {"all_to_all_single_autograd", "all_to_all_single"} <= calls  # torch's own


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
    tp, ep = result["layouts"]["tp"], result["layouts"]["ep"]
    assert tp["mesh"]["tp"] == 2 and tp["memory"]["over_by_hand"] == 1.0
    assert ep["memory"]["over_by_hand"] == 1.0 and ep["memory"]["over_theory"] == 1.0
    for name, layout in result["layouts"].items():
        # the same weights and rows: the same first-step loss on both sides (the same work)
        loss = layout["first_loss"]
        assert loss["max_abs_diff"] <= 1e-5 and 5.0 < loss["by_hand"] < 7.5, (name, loss)
        assert not any(c.startswith("meshtrain") for c in layout["own_classes"]["by_hand"])
        assert layout["overhead_ratio"] > 0 and layout["cpu_overhead_ratio"] > 0
        if not layout["null"]:  # each ratio beside the null layout of the same run
            assert layout["floor"]["layout"] == "null_full_shard", name
            assert layout["floor"]["cpu_overhead_ratio"] > 0
            assert isinstance(layout["goal_met"], bool)
    # the hand-written tp keeps its 5 norms plain (replicated, computed on as plain tensors);
    # transform() keeps them as Replicate DTensors
    assert tp["plain_parameters"] == {"transform": 0, "by_hand": 5}, tp
    assert entry["plain_parameters"] == {"transform": 0, "by_hand": 0}
    # the hand-written ep moves tokens with the benchmark's torch-only module
    assert ep["own_classes"] == {
        "transform": ["meshtrain_runtime.parallel.expert.ExpertParallelExperts"],
        "by_hand": ["ep_by_hand.AllToAllExperts"]}, ep["own_classes"]
    machine = result["machine"]
    assert len(machine["load_start"]) == 3 and len(machine["load_end"]) == 3
