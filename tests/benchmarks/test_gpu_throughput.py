"""benchmarks/gpu_throughput.py (issue 20's GPU table) checked on CPU with its tiny smoke model.

No figure here means anything for speed; what is checked is that each pair compares the same
model: transform() and the hand-written torch layout start from the same weights (equal first
loss) and checkpoint the same blocks (equal saved-activation bytes), and that variants this host
cannot run are reported with the runtime's reason, not dropped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_throughput", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_pairs_compare_the_same_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    bench = _bench()
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(BENCHMARK), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "transform / torch, ac: step time x" in done.stdout
    result = json.loads(out.read_text())
    runs = result["results"]
    assert list(runs) == bench.SMOKE_VARIANTS
    for setup in ("ac", "ac_fused", "none"):
        ours, theirs = runs[f"transform_{setup}"], runs[f"torch_{setup}"]
        assert ours["skipped"] is None and theirs["skipped"] is None
        assert ours["first_loss"] == pytest.approx(theirs["first_loss"], abs=1e-6), setup
        assert ours["saved_activation_bytes"] == theirs["saved_activation_bytes"], setup
        args = result["args"]
        assert ours["tokens_per_s"] == pytest.approx(
            args["batch_size"] * args["seq_len"] / ours["step_s"])
    # checkpointing every block keeps only the blocks' inputs
    assert runs["torch_ac"]["saved_activation_bytes"] < runs["torch_none"]["saved_activation_bytes"]
    assert "nothing to offload from" in runs["transform_cpu_offload_fused"]["skipped"]
    for side in ("torch", "transform"):
        assert "compute capability 9.0" in runs[f"{side}_fp8_compile_fused"]["skipped"]
    assert [row["setup"] for row in result["comparisons"]] == ["ac", "ac_fused", "none"]


def test_the_goal_is_read_on_the_compiled_checkpointed_pair() -> None:
    bench = _bench()

    def run(step_s: float) -> dict:
        return {"skipped": None, "step_s": step_s, "first_loss": 2.0,
                "peak_allocated_bytes": 10 * 2**30}

    rows = bench.comparisons({"transform_ac_compile_fused": run(0.175),
                              "torch_ac_compile_fused": run(0.172),
                              "transform_none": run(0.2),
                              "torch_none": {"skipped": "out of memory"}})
    (row,) = rows  # a pair with a skipped side is not compared
    assert row["setup"] == "ac_compile_fused" and row["goal_met"] is True
    assert row["step_time_ratio"] == pytest.approx(0.175 / 0.172)
    assert row["peak_memory_ratio"] == 1.0
    assert bench.comparisons({"transform_ac_compile_fused": run(0.18),
                              "torch_ac_compile_fused": run(0.172)})[0]["goal_met"] is False


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARK)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs a CUDA GPU" in done.stderr and "--smoke" in done.stderr
