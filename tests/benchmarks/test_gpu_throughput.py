"""benchmarks/gpu_throughput.py (issue 20's GPU table) checked on CPU with its tiny smoke model.

No figure here means anything for speed; what is checked is that each pair compares the same
model on the same layout: transform() and the hand-written torch layout start from the same
weights (equal first loss), checkpoint the same blocks (equal saved-activation bytes) and build
the same FSDP groups (a hand-written side that reshards after forward is refused), that the
sides are timed interleaved, and that variants this host cannot run are reported with the
runtime's reason, not dropped.
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
    sys.modules["gpu_throughput"] = module  # its dataclasses look their module up there
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
    assert "same layout: 5 FSDP groups: 2 blocks (reshard_after_forward False)" in done.stdout
    result = json.loads(out.read_text())
    runs, args = result["results"], result["args"]
    assert [pair["setup"] for pair in result["pairs"]] == bench.SMOKE_PAIRS
    for setup in ("ac", "sac", "ac_fused", "none", "ac_offload_fused"):
        ours, theirs = runs[f"transform_{setup}"], runs[f"torch_{setup}"]
        assert ours["skipped"] is None and theirs["skipped"] is None
        assert ours["first_loss"] == pytest.approx(theirs["first_loss"], abs=1e-6), setup
        assert ours["saved_activation_bytes"] == theirs["saved_activation_bytes"], setup
        assert ours["tokens_per_s"] == pytest.approx(
            args["batch_size"] * args["seq_len"] / ours["step_s"])
        # interleaved: every round timed both sides, --steps steps each
        (pair,) = [p for p in result["pairs"] if p["setup"] == setup]
        assert len(pair["round_ratios"]) == args["rounds"] == 2
        groups = pair["layout"]
        assert [g["module"] for g in groups] == [
            "<root>", "model.embed_tokens", "model.layers.0", "model.layers.1", "lm_head"]
        assert not any(g["reshard_after_forward"] for g in groups)
    # checkpointing every block keeps only the blocks' inputs
    assert runs["torch_ac"]["saved_activation_bytes"] < runs["torch_none"]["saved_activation_bytes"]
    for side in ("torch", "transform"):
        assert "nothing to offload from" in runs[f"{side}_ac_cpu_offload_fused"]["skipped"]
        assert "compute capability 9.0" in runs[f"{side}_fp8_compile_fused"]["skipped"]
    assert [row["setup"] for row in result["comparisons"]] == [
        "ac", "sac", "ac_fused", "none", "ac_offload_fused"]


def test_a_pair_whose_layouts_differ_is_a_failed_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-written side resharding after forward (fully_shard's default, the unfair pair
    of issue 28) against transform() on a world of one: the check names the difference."""
    pytest.importorskip("transformers")
    import torch

    from meshtrain_runtime import state

    bench = _bench()
    common = sys.modules["gpu_common"]
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    state.reset(destroy_process_group=True)
    try:
        args = bench.parse_args(["--smoke"])
        device = torch.device("cpu")
        ours = common.through_transform("ac", common.build_llama(args, device), device)
        monkeypatch.setattr(common, "HAND_RESHARD_AFTER_FORWARD", True)
        hand = common.by_hand("ac", common.build_llama(args, device), device)
        with pytest.raises(common.LayoutMismatch, match=r"model\.layers\.0"):
            common.check_same_layout("ac", hand, ours)
        monkeypatch.setattr(common, "HAND_RESHARD_AFTER_FORWARD", False)
        same = common.by_hand("ac", common.build_llama(args, device), device)
        assert len(common.check_same_layout("ac", same, ours)) == 5
    finally:
        state.reset(destroy_process_group=True)


def test_the_goal_is_read_on_the_compiled_checkpointed_pair() -> None:
    bench = _bench()

    def pair(setup: str, ratios: list[float], step_s: tuple[float, float]) -> dict:
        def side(name: str, seconds: float) -> dict:
            return {"variant": f"{name}_{setup}", "skipped": None, "step_s": seconds,
                    "first_loss": 2.0, "peak_allocated_bytes": 10 * 2**30}

        return {"setup": setup, "skipped": None, "round_ratios": ratios, "layout_text": "L",
                "results": {f"torch_{setup}": side("torch", step_s[0]),
                            f"transform_{setup}": side("transform", step_s[1])}}

    row = bench.comparison(pair("ac_compile_fused", [1.01, 1.03, 1.015, 1.0], (0.172, 0.175)))
    assert row["goal_met"] is True  # the median of the interleaved rounds, not of the steps
    assert row["step_time_ratio"] == pytest.approx(1.0125)
    assert row["round_ratio_spread"] == [1.0, 1.03]
    assert row["median_step_ratio"] == pytest.approx(0.175 / 0.172)
    assert row["peak_memory_ratio"] == 1.0
    assert bench.comparison(pair("ac_compile_fused", [1.03, 1.04], (0.17, 0.18)))[
        "goal_met"] is False
    assert "goal" not in bench.comparison(pair("ac", [1.5], (0.1, 0.15)))
    assert bench.comparison({"setup": "ac", "skipped": "out of memory", "results": {}}) is None


def test_the_selective_goal_needs_the_ratio_and_40_percent_mfu() -> None:
    """sac_compile_fused (issue 47): transform / torch <= 1.02 and transform's MFU >= 40 %."""
    bench = _bench()

    def pair(ratio: float, mfu: float) -> dict:
        side = {"skipped": None, "step_s": 0.15, "first_loss": 2.0, "mfu": mfu,
                "tokens_per_s": 1.0, "peak_allocated_bytes": None}
        return {"setup": "sac_compile_fused", "skipped": None, "round_ratios": [ratio],
                "layout_text": "L", "results": {"torch_sac_compile_fused": side,
                                                "transform_sac_compile_fused": side}}

    assert bench.PAIRS[0] == "sac_compile_fused"
    assert bench.comparison(pair(1.01, 0.41))["goal_met"] is True
    assert bench.comparison(pair(1.01, 0.39))["goal_met"] is False  # fast enough, MFU short
    assert bench.comparison(pair(1.03, 0.45))["goal_met"] is False
    assert "MFU 41.0 %" in bench.report([pair(1.01, 0.41)], "H200")


def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    done = subprocess.run([sys.executable, str(BENCHMARK)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs a CUDA GPU" in done.stderr and "--smoke" in done.stderr
