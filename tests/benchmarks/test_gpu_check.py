"""`make gpu-check-smoke` in CI: benchmarks/gpu_check.py on CPU with tiny shapes.

The smoke run checks the script that a session lent a GPU will run (its sections, its report,
its exit status) and the numerical checks of the `gpu` tier whose arithmetic also runs on CPU.
It fails when a section of the report is missing or empty, or when one of those checks fails;
both failures are shown here on purpose-made inputs, as are a section whose runner crashes
(recorded as failed, the next sections still run) and a run stopped by SIGTERM (every section
still in the report, the unfinished ones cut with why).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
CPU_CASES = {  # the gpu tier's cases that run on CPU in the smoke run
    "test_bf16_mixed_precision_tracks_fp32", "test_checkpointing_matches_eager[full]",
    "test_checkpointing_matches_eager[selective]",
    "test_activation_offloading_moves_the_inputs_and_matches", "test_fused_adamw_matches_foreach",
    "test_fp16_scaler_recovers_underflowed_gradients_and_skips_inf",
    "test_fp16_scaled_gradients_track_fp32_over_a_series",
    "test_grouped_expert_matmuls_match_a_dense_reference[dtype0]",
    "test_grouped_expert_matmuls_match_a_dense_reference[dtype1]",
    *(f"test_context_parallel_blockwise_attention_matches_sdpa[{dtype}-{cp}]"
      for dtype in ("fp32", "bf16") for cp in (2, 4)),
    "test_zero_bubble_split_backward_matches_one_backward[plain]",
    "test_zero_bubble_split_backward_matches_one_backward[checkpointed]",
}
CUDA_ONLY = {"test_cpu_offload_matches_the_device_run", "test_compile_matches_eager[full]",
             "test_compile_matches_eager[selective]", "test_fp8_linears_track_bf16"}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _smoke(out: Path, *extra: str, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpu-check")
    done = _smoke(out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (report_file,) = out.glob("gpu-cpu-*.json")
    assert report_file.with_suffix(".md").exists()
    return {"stdout": done.stdout, "report": json.loads(report_file.read_text()),
            "markdown": report_file.with_suffix(".md").read_text()}


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_report_has_every_section(smoke: dict[str, Any]) -> None:
    report_format = _module("gpu_check_report")
    report = smoke["report"]
    assert report_format.problems(report) == []
    assert report["device"] == "cpu" and report["smoke"] is True
    statuses = {name: s["status"] for name, s in report["sections"].items()}
    assert statuses == {"pytest": "passed", "planner": "passed", "throughput": "passed",
                        "docker": "skipped"}
    assert "needs a GPU" in report["sections"]["docker"]["reason"]
    assert any("needs >= 2 GPUs" in row["reason"] for row in report["multi_rank"])
    assert "| pytest | passed |" in smoke["stdout"]  # the summary table
    assert "## planner: passed" in smoke["markdown"]


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_runs_the_cpu_numerics_and_skips_only_cuda_paths(smoke: dict[str, Any]) -> None:
    tests = {t["test"].split("::")[-1]: t for t in smoke["report"]["sections"]["pytest"]["tests"]}
    assert {name for name, t in tests.items() if t["outcome"] == "passed"} == CPU_CASES
    assert {name for name, t in tests.items() if t["outcome"] == "skipped"} == CUDA_ONLY
    assert all(tests[name]["reason"].startswith("needs a GPU") for name in CUDA_ONLY)
    figures = tests["test_activation_offloading_moves_the_inputs_and_matches"]["figures"]
    assert figures and "0 B copied" in figures[0]  # a CPU host copies nothing


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_planner_and_throughput_sections(smoke: dict[str, Any]) -> None:
    sections = smoke["report"]["sections"]
    rows = sections["planner"]["rows"]
    assert {(r["layout"], r["phase"]) for r in rows} == {
        (layout, phase) for layout in ("fsdp", "ac", "ac_offload", "sac")
        for phase in ("forward", "loss", "backward", "optimizer_step")}
    assert all(r["measured_bytes"] > 0 and r["planned_bytes"] > 0 for r in rows)
    assert all(r["shape"]["layers"] == 2 and "params" in r for r in rows)  # replayable
    compared = {c["setup"]: c for c in sections["throughput"]["comparisons"]}
    assert set(compared) == {"ac", "sac", "ac_offload_fused"}
    for row in compared.values():
        assert row["first_loss_difference"] < 1e-6
        assert "5 FSDP groups" in row["layout"]
    skipped = {p["setup"]: p["skipped"] for p in sections["throughput"]["pairs"] if p["skipped"]}
    assert "nothing to offload from" in skipped["ac_cpu_offload_fused"]
    assert "compute capability 9.0" in skipped["fp8_compile_fused"]


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_a_missing_or_empty_section_fails_the_report(smoke: dict[str, Any]) -> None:
    report_format = _module("gpu_check_report")
    report = json.loads(json.dumps(smoke["report"]))
    del report["sections"]["planner"]
    report["sections"]["throughput"]["pairs"] = []
    assert report_format.problems(report) == [
        "section missing: planner", "section throughput: passed but holds no pairs"]
    del report["multi_rank"]
    assert "section missing: multi_rank" in report_format.problems(report)


def test_the_script_exits_1_when_its_report_misses_a_section(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A section the report must hold but no runner wrote (here one added to SECTIONS)."""
    gpu_check = _module("gpu_check")
    monkeypatch.setattr(gpu_check.report_format, "SECTIONS", (*gpu_check.report_format.SECTIONS,
                                                              "extra"))
    code = gpu_check.main(["--smoke", "--only", "docker", "--out", str(tmp_path)])
    assert code == 1
    assert "gpu-check: section missing: extra" in capsys.readouterr().err


def _fast_sections(gpu_check, monkeypatch: pytest.MonkeyPatch, **runners) -> None:
    """Every section's runner replaced by a quick one (`runners` for the named ones)."""
    results = {"pytest": {"tests": [{"test": "t.py::test_x", "outcome": "passed",
                                     "seconds": 0.1}]},
               "planner": {"rows": [{"layout": "fsdp", "phase": "loss", "measured_bytes": 1,
                                     "planned_bytes": 1, "ratio": 1.0}]},
               "throughput": {"pairs": [{"setup": "ac"}], "table": "| variant |"},
               "docker": {"job": {"output": "ok"}}}

    def passed(name: str):
        return lambda args, cap, work: {"status": "passed", "seconds": 0.1, **results[name]}

    fast = {name: runners.get(name, passed(name)) for name in gpu_check.SECTION_RUNNERS}
    monkeypatch.setattr(gpu_check, "SECTION_RUNNERS", fast)


def test_a_crashing_section_is_recorded_failed_and_the_rest_still_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_check = _module("gpu_check")

    def crash(args, cap, work):
        raise RuntimeError("planner broke")

    _fast_sections(gpu_check, monkeypatch, planner=crash)
    assert gpu_check.main(["--smoke", "--out", str(tmp_path)]) == 1
    (report_file,) = tmp_path.glob("gpu-cpu-*.json")
    sections = json.loads(report_file.read_text())["sections"]
    assert sections["planner"]["status"] == "failed"
    assert "RuntimeError: planner broke" in sections["planner"]["reason"]
    assert [sections[n]["status"] for n in ("pytest", "throughput", "docker")] == ["passed"] * 3


def test_a_run_stopped_by_sigterm_keeps_every_section_in_its_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM while the throughput section runs (a device call's time limit): the report on
    disk holds all four sections, the finished ones as they ended, the rest cut with why."""
    import signal

    gpu_check = _module("gpu_check")

    def stopped(args, cap, work):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the section")

    _fast_sections(gpu_check, monkeypatch, throughput=stopped)
    assert gpu_check.main(["--smoke", "--out", str(tmp_path)]) == 1
    (report_file,) = tmp_path.glob("gpu-cpu-*.json")
    report = json.loads(report_file.read_text())
    report_format = _module("gpu_check_report")
    assert report_format.problems(report) == []  # no section missing
    statuses = {name: s["status"] for name, s in report["sections"].items()}
    assert statuses == {"pytest": "passed", "planner": "passed", "throughput": "cut",
                        "docker": "cut"}
    for name in ("throughput", "docker"):
        assert report["sections"][name]["reason"] == (
            "stopped by signal SIGTERM before this section finished")
    assert "MISSING" not in report_file.with_suffix(".md").read_text()


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_a_failing_cpu_numerical_check_fails_the_smoke_run(tmp_path: Path) -> None:
    """mixed_precision broken on purpose (dropped by a sitecustomize in the section's process):
    the bf16 and fp16 cases fail, the fp32 ones pass, the section fails, the run exits 1."""
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "sitecustomize.py").write_text(
        "import meshtrain_runtime.parallel.fsdp as fsdp\n"
        "from torch.distributed.fsdp import MixedPrecisionPolicy\n"
        "fsdp.resolve_mixed_precision = lambda value: MixedPrecisionPolicy()\n")
    done = _smoke(tmp_path / "out", "--only", "pytest",
                  env={"PYTHONPATH": os.pathsep.join(filter(None, [
                      str(patch), os.environ.get("PYTHONPATH")])),
                       # the precision cases and one beside them (the rest ran in `smoke`)
                       "PYTEST_ADDOPTS": "-k 'mixed_precision or fp16 or fused_adamw'"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    (report_file,) = (tmp_path / "out").glob("gpu-cpu-*.json")
    section = json.loads(report_file.read_text())["sections"]["pytest"]
    assert section["status"] == "failed"
    failed = {t["test"].split("::")[-1] for t in section["tests"] if t["outcome"] == "failed"}
    assert failed == {"test_bf16_mixed_precision_tracks_fp32",
                      "test_fp16_scaler_recovers_underflowed_gradients_and_skips_inf"}
    passed = {t["test"].split("::")[-1] for t in section["tests"] if t["outcome"] == "passed"}
    assert "test_fused_adamw_matches_foreach" in passed
