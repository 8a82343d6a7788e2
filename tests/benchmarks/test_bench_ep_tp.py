"""bench_ep_alltoall.py under TP x EP (issue 32): the all-to-all bytes of a tp pair that shares
its tokens equal the routed theory for each rank's share, and the report prints the row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402


@pytest.mark.multiprocess
def test_tp_x_ep_all_to_all_bytes_equal_the_routed_theory(tmp_path: Path) -> None:
    out = tmp_path / "ep_tp.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_ep_alltoall.py"), "--ranks", "2", "--tp", "2",
         "--ep", "2", "--tokens", "128", "--hidden", "64", "--intermediate", "128",
         "--steps", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["measured_over_theoretical"] == 1.0
    # Each tp rank sends about half its tokens' routes (uniform expectation uses tokens / tp);
    # dispatching every shared token from both ranks would make this about 2.
    assert 0.8 < summary["measured_over_uniform"] < 1.2
    entry = report.ep_comm_entry(summary)
    doc = report.build_report([], machine={"name": "test"}, ep_tp_comm=summary)
    assert doc["ep_tp_all_to_all"] == entry
