"""benchmarks/bench_data.py: its smoke run (one process, tiny sizes), and the table report.py
renders from it. The figures themselves are benchmarks/RESULTS.md's (a quiet machine's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench_data") / "data.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_data.py"), "--smoke",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.multiprocess  # DataLoader worker processes
def test_smoke_measures_both_sides_on_the_same_tokens(smoke: dict) -> None:
    for source in ("text_jsonl", "tokens_npy"):
        entry = smoke[source]
        read = set(entry["tokens_per_pass"].values())
        assert len(read) == 1 and read.pop() > 0  # all four sides read one pass of equal size
        assert set(entry["tokens_per_s"]) == {"loader_w0", "torch_w0", "loader_w2", "torch_w2"}
        assert all(rate > 0 for rate in entry["tokens_per_s"].values())
        assert entry["ratio"]["w0"] == pytest.approx(
            entry["tokens_per_s"]["loader_w0"] / entry["tokens_per_s"]["torch_w0"])
    assert smoke["text_jsonl"]["samples"] == smoke["tokens_npy"]["samples"]  # the same samples
    step = smoke["step_time"]
    assert step["wall"]["n"] == step["rounds"] and step["goal"] == 1.02
    assert step["goal_met"] == (step["wall"]["median"] <= 1.02 and step["cpu"]["median"] <= 1.02)


@pytest.mark.multiprocess
def test_the_report_renders_the_data_table(smoke: dict) -> None:
    built = report.build_report([], machine={"description": "test"}, data=smoke)
    assert built["goals_met"]["data_step_le_1.02"] == smoke["step_time"]["goal_met"]
    table = report.render_markdown(built)
    assert "| .jsonl text, UTF-8 bytes | 2 |" in table and "| pre-tokenized .npy | 0 |" in table
    assert "Step time fed by the loader / in memory" in table
