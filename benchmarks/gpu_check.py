"""`make gpu-check`: every check meshtrain needs a GPU for, in one command, within a budget.

Sections, in this order, each in a process of its own under a time cap (its share of
--budget-s, at most what is left), the report written again after each:

  pytest      the `gpu` tier (tests/gpu): every one-GPU CUDA path against eager / fp32
  planner     meshtrain's plan beside the measured per-phase peaks (gpu_check_planner.py)
  throughput  gpu_throughput.py's fair table: transform() vs hand-written, same layout,
              interleaved (the goal pair first; pairs the cap leaves out say so)
  docker      a local_gpu job through a Docker engine, when one answers (skipped otherwise)

Writes gpu-<device>-<date>.json and .md into --out and prints a summary table. Exit status: 1
when a check failed (a test, a layout mismatch, a crashed section, the docker job, a section
missing from the report), else 0: a slow figure or a missed goal is reported, never an error.
A section cut at its cap is "cut" with what it finished.

    python benchmarks/gpu_check.py --out results/        # on a CUDA GPU (< 6 min on an H100)
    python benchmarks/gpu_check.py --smoke --out /tmp/x  # CPU, tiny shapes: checks the script
    python benchmarks/gpu_check.py --only planner        # one section
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/ is not a package

import gpu_check_report as report_format  # noqa: E402

ROOT = HERE.parent
SHARES = {"pytest": 0.27, "planner": 0.15, "throughput": 0.52, "docker": 0.06}
"""Each section's cap as a share of --budget-s (330 s: 89, 50, 172, 20 s): estimates, not yet
timed on a GPU (a fresh machine compiles the compile case's and the goal pair's kernels)."""
SMOKE_BUDGET_S = 900.0
"""The smoke run needs ~25 CPU-seconds; on a loaded 2-core machine that can take minutes."""
SMOKE_PAIRS = ("ac", "ac_offload_fused", "ac_cpu_offload_fused", "fp8_compile_fused")
"""The smoke run's pairs: two that run on CPU, two refused there with the runtime's reason
(tests/benchmarks/test_gpu_throughput.py runs the rest of the smoke table)."""
THROUGHPUT_TAIL_S = 75.0
"""The throughput section starts no pair later than this before its cap (a compiled pair
takes about this long at 1.1B)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for the report")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="all sections together (default 330: under 6 min on an H100; "
                             f"with --smoke {SMOKE_BUDGET_S:.0f}: a CPU shared with others)")
    parser.add_argument("--cap", action="append", default=[], metavar="SECTION=SECONDS",
                        help="override one section's cap")
    parser.add_argument("--only", choices=report_format.SECTIONS, action="append",
                        help="run only this section (repeatable); the others read not_run")
    parser.add_argument("--smoke", action="store_true",
                        help="on CPU with tiny shapes: checks the script and the CPU numerics")
    parser.add_argument("--pairs", default=None,
                        help="the throughput section's pairs (gpu_throughput.py --pairs); "
                             "default: all, the goal pair first")
    parser.add_argument("--commit", default=None, help="the commit under test (else git's)")
    args = parser.parse_args(argv)
    if args.budget_s is None:
        args.budget_s = SMOKE_BUDGET_S if args.smoke else 330.0
    args.caps = {name: share * args.budget_s for name, share in SHARES.items()}
    for item in args.cap:
        name, _, seconds = item.partition("=")
        if name not in SHARES or not seconds:
            parser.error(f"--cap {item!r}: use SECTION=SECONDS, SECTION one of "
                         f"{', '.join(SHARES)}")
        args.caps[name] = float(seconds)
    return args


def run_process(command: list[str], cap: float, env: dict[str, str] | None = None,
                log: Path | None = None) -> tuple[int | None, str, float]:
    """Run `command` from the repository root under `cap` seconds: (exit code or None when
    cut, the output's last 4000 characters, seconds). Output goes to `log` as it comes."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") if log is None else open(log, "w+") as handle:
        process = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            code: int | None = process.wait(timeout=max(1.0, cap))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)  # the section's own process group, nothing else
            process.wait()
            code = None
        handle.seek(0)
        output = handle.read()[-4000:]
    return code, output, time.monotonic() - start


def _status(code: int | None) -> str:
    return "cut" if code is None else ("passed" if code == 0 else "failed")


def section_pytest(args: argparse.Namespace, cap: float, work: Path) -> dict[str, Any]:
    log = work / "pytest.jsonl"
    env = {"GPU_CHECK_PYTEST_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    if args.smoke:
        env["MESHTRAIN_GPU_CHECK_ON_CPU"] = "1"
    command = [sys.executable, "-m", "pytest", "-p", "gpu_check_pytest", "-p", "no:cacheprovider",
               "-p", "no:xdist", "-q", "-rs", "-m", "gpu", "tests/gpu"]
    code, output, seconds = run_process(command, cap, env, work / "pytest.log")
    tests = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    counts = {o: sum(t["outcome"] == o for t in tests) for o in ("passed", "failed", "skipped")}
    status = _status(code)
    if code not in (0, 1, None) or (code == 0 and not tests) or counts["failed"]:
        status = "failed"  # 5: nothing collected; a failed test fails a section cut later too
    return {"status": status, "seconds": seconds, "tests": tests,
            "headline": ", ".join(f"{n} {o}" for o, n in counts.items()),
            "reason": "" if status == "passed" else output[-1500:]}


def section_planner(args: argparse.Namespace, cap: float, work: Path) -> dict[str, Any]:
    out = work / "planner.json"
    command = [sys.executable, str(HERE / "gpu_check_planner.py"), "--json", str(out)]
    code, output, seconds = run_process(command + (["--smoke"] if args.smoke else []), cap)
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    within = sum(r["within_goal"] for r in rows)
    headline = (f"{within} of {len(rows)} phases within 5 % of the plan; measured / planned "
                f"{min(ratios):.3f}..{max(ratios):.3f}") if ratios else ""
    return {"status": _status(code), "seconds": seconds, "rows": rows, "headline": headline,
            "reason": "" if code == 0 else output[-1500:]}


def section_throughput(args: argparse.Namespace, cap: float, work: Path) -> dict[str, Any]:
    out = work / "throughput.json"
    command = [sys.executable, str(HERE / "gpu_throughput.py"), "--json", str(out)]
    command += ["--smoke", "--pairs", args.pairs or ",".join(SMOKE_PAIRS)] if args.smoke else \
        ["--budget-s", str(max(0.0, cap - THROUGHPUT_TAIL_S))] + (
            ["--pairs", args.pairs] if args.pairs else [])
    code, output, seconds = run_process(command, cap)
    data = json.loads(out.read_text()) if out.exists() else {"pairs": [], "comparisons": []}
    import gpu_throughput

    goal = [c for c in data["comparisons"] if "goal" in c]
    headline = (f"goal pair {goal[0]['setup']}: x{goal[0]['step_time_ratio']:.3f} "
                f"({'met' if goal[0]['goal_met'] else 'missed'})") if goal else \
        f"{len(data['comparisons'])} pairs compared"
    return {"status": _status(code), "seconds": seconds, "pairs": data["pairs"],
            "comparisons": data["comparisons"], "headline": headline,
            "table": gpu_throughput.report(data["pairs"], data.get("device", "?"))
            if data["pairs"] else "", "reason": "" if code == 0 else output[-1500:]}


def section_docker(args: argparse.Namespace, cap: float, work: Path) -> dict[str, Any]:
    if args.smoke:
        return {"status": "skipped", "seconds": 0.0,
                "reason": "smoke run: a local_gpu job needs a GPU"}
    code, output, seconds = run_process(["docker", "info"], 20) if _has_docker() else \
        (127, "docker is not on PATH", 0.0)
    if code != 0:
        return {"status": "skipped", "seconds": seconds,
                "reason": f"no Docker engine answers here: {output.strip()[-300:]}"}
    code, output, seconds = run_process([sys.executable, str(HERE / "gpu_check_docker.py")], cap)
    return {"status": _status(code), "seconds": seconds, "job": {"output": output[-1500:]},
            "reason": "" if code == 0 else output[-1500:]}


def _has_docker() -> bool:
    from shutil import which

    return which("docker") is not None


SECTION_RUNNERS = {"pytest": section_pytest, "planner": section_planner,
                   "throughput": section_throughput, "docker": section_docker}


def environment(commit: str | None) -> tuple[str, dict[str, Any]]:
    """The device's name and what the figures depend on (versions, commit)."""
    import importlib.metadata as metadata

    import torch

    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    versions = {}
    for package in ("meshtrain", "torchao", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    if commit is None:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True)
        commit = done.stdout.strip() if done.returncode == 0 else "unknown"
    return device, {"python": sys.version.split()[0], "torch": torch.__version__,
                    "cuda": torch.version.cuda, "gpus": torch.cuda.device_count() if cuda else 0,
                    **versions, "commit": commit}


def multi_rank_paths(gpus: int) -> list[dict[str, str]]:
    """What one GPU cannot check (NCCL refuses two ranks on one device); the multiprocess tier
    runs each of them with gloo on CPU."""
    reason = f"needs >= 2 GPUs (this machine has {gpus})" if gpus < 2 else \
        "not run by gpu-check: run the multiprocess tier with NCCL on this machine"
    return [{"path": path, "reason": reason} for path in (
        "full shard / hybrid shard over NCCL (reduce-scatter, all-gather, all-reduce)",
        "fp8's float8 all-gather (FSDP2 with a shard group > 1)",
        "tensor parallelism (and sequence / loss parallelism) over NCCL",
        "expert parallelism's all-to-all dispatch over NCCL",
        "context parallelism's attention across the cp ranks over NCCL",
        "pipeline parallelism's sends between stages over NCCL",
    )]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, env = environment(args.commit)
    report: dict[str, Any] = {
        "device": device, "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d"), "smoke": args.smoke, "budget_s": args.budget_s, "caps": args.caps,
        "environment": env, "multi_rank": multi_rank_paths(env["gpus"]), "sections": {},
        "only": args.only or []}
    if device == "cpu" and not args.smoke:
        print("gpu_check.py needs a CUDA GPU: torch.cuda.is_available() is False here. Use "
              "--smoke on CPU (tiny shapes; checks the script and the CPU numerics).",
              file=sys.stderr)
        return 2
    out, start = Path(args.out), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for name, runner in SECTION_RUNNERS.items():
            if args.only and name not in args.only:
                report["sections"][name] = {"status": "not_run", "seconds": 0.0,
                                            "reason": f"--only {','.join(args.only)}"}
                continue
            cap = min(args.caps[name], args.budget_s - (time.monotonic() - start))
            if cap <= 1:
                report["sections"][name] = {"status": "cut", "seconds": 0.0,
                                            "reason": f"budget {args.budget_s:.0f} s spent"}
            else:
                print(f"gpu-check: {name} (cap {cap:.0f} s)", flush=True)
                report["sections"][name] = runner(args, cap, Path(work))
            paths = report_format.write(report, out)
    print(report_format.summary_table(report))
    print(f"report: {paths[0]} and {paths[1].name}")
    failed = [n for n, s in report["sections"].items() if s["status"] == "failed"]
    problems = report_format.problems(report)
    for problem in problems:
        print(f"gpu-check: {problem}", file=sys.stderr)
    if failed:
        print(f"gpu-check: failed checks in {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
