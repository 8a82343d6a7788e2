"""`make gpu-check`: every check meshtrain needs a GPU for, in one command, within a budget.

Sections, in this order, each in a process of its own under a time cap (its share of
--budget-s, at most what is left). The report holds every section from the start: one not yet
reached reads "cut" (with why) until it runs, so a run stopped from outside (a SIGTERM, the
device call's time limit) leaves an honest report; a section that crashes is "failed" with its
traceback and the next one still runs. The report is written again after each section:

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
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # benchmarks/ is not a package

import gpu_check_report as report_format  # noqa: E402

ROOT = HERE.parent
SHARES = {"pytest": 0.25, "planner": 0.12, "throughput": 0.58, "docker": 0.05}
"""Each section's cap as a share of --budget-s (400 s: 100, 48, 232, 20 s). On the H200
(2026-11-27, budget 330 s) pytest took 33-50 s, the planner 21 s for 4 layouts, the
throughput table 109 s for six pairs; this build adds the gpu tier's context-parallel,
zero-bubble, fp16-series and selective-compile cases, two planner layouts and the selective
pairs (the goal pair first)."""
DEFAULT_BUDGET_S = 400.0
"""Every section in one run, under 7 minutes: a lent GPU's command limit is 10 minutes."""
SMOKE_BUDGET_S = 900.0
"""The smoke run needs ~55 CPU-seconds (2026-11-28); on a loaded 2-core machine that can take
minutes (415 s at a load average of 20-28)."""
SMOKE_SHARES = {"pytest": 0.5, "planner": 0.15, "throughput": 0.3, "docker": 0.05}
"""On CPU the pytest section (the gpu tier's CPU-runnable cases) is the largest: 225 s of a
loaded machine's 415 s."""
SMOKE_PAIRS = ("ac", "sac", "ac_offload_fused", "ac_cpu_offload_fused", "fp8_compile_fused")
"""The smoke run's pairs: three that run on CPU, two refused there with the runtime's reason
(tests/benchmarks/test_gpu_throughput.py runs the rest of the smoke table)."""
THROUGHPUT_TAIL_S = 75.0
"""The throughput section starts no pair later than this before its cap (a compiled pair
takes about this long at 1.1B)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for the report")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"all sections together (default {DEFAULT_BUDGET_S:.0f}: under 7 "
                             f"min on an H200; with --smoke {SMOKE_BUDGET_S:.0f}: a CPU shared "
                             "with others)")
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
        args.budget_s = SMOKE_BUDGET_S if args.smoke else DEFAULT_BUDGET_S
    shares = SMOKE_SHARES if args.smoke else SHARES
    args.caps = {name: share * args.budget_s for name, share in shares.items()}
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
        except BaseException:  # stopped from outside: the section's processes end with us
            os.killpg(process.pid, 9)
            process.wait()
            raise
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
    """What one GPU cannot check (NCCL refuses two ranks on one device), and what this build
    does not have."""
    reason = f"needs >= 2 GPUs (this machine has {gpus})" if gpus < 2 else \
        "not run by gpu-check: run the multiprocess tier with NCCL on this machine"
    return [{"path": path, "reason": reason} for path in (
        "full shard / hybrid shard over NCCL (reduce-scatter, all-gather, all-reduce)",
        "fp8's float8 all-gather (FSDP2 with a shard group > 1)",
        "tensor parallelism (and sequence / loss parallelism) over NCCL",
        "expert parallelism's all-to-all dispatch over NCCL",
        "context parallelism's ring exchange over NCCL (its blockwise kernels: the pytest "
        "section's test_cuda_parallel.py, every cp rank on this one GPU)",
        "pipeline stages over NCCL (the zero-bubble split backward: the pytest section's "
        "test_cuda_parallel.py, a pipeline group of one rank holding both stages)",
    )]


class Stopped(Exception):
    """The run was told to stop (SIGTERM): the running section is cut, the report written."""


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(f"stopped by signal {signal.Signals(signum).name}")


def _not_reached(reason: str) -> dict[str, Any]:
    return {"status": "cut", "seconds": 0.0, "reason": reason}


def run_section(name: str, args: argparse.Namespace, cap: float, work: Path) -> dict[str, Any]:
    """One section's result; a crash of its runner is its failure (with the traceback), never
    the end of the run."""
    start = time.monotonic()
    try:
        return SECTION_RUNNERS[name](args, cap, work)
    except Stopped:
        raise
    except Exception:
        return {"status": "failed", "seconds": time.monotonic() - start,
                "reason": "the section's runner raised:\n" + traceback.format_exc()[-1500:]}


def _run_sections(args: argparse.Namespace, report: dict[str, Any], out: Path, start: float,
                  work: Path) -> None:
    """Each section in turn, under its cap and what is left of the budget; the report written
    after each."""
    for name in SECTION_RUNNERS:
        if args.only and name not in args.only:
            continue
        cap = min(args.caps[name], args.budget_s - (time.monotonic() - start))
        if cap <= 1:
            report["sections"][name] = _not_reached(f"budget {args.budget_s:.0f} s spent")
        else:
            print(f"gpu-check: {name} (cap {cap:.0f} s)", flush=True)
            report["sections"][name] = run_section(name, args, cap, work)
        report_format.write(report, out)


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
    for name in SECTION_RUNNERS:  # every section is in the report from the start
        report["sections"][name] = {"status": "not_run", "seconds": 0.0,
                                    "reason": f"--only {','.join(args.only)}"} \
            if args.only and name not in args.only else \
            _not_reached("the run ended before this section started")
    paths = report_format.write(report, out)
    previous, stopped = signal.signal(signal.SIGTERM, _stop), False
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
            _run_sections(args, report, out, start, Path(work))
    except Stopped as stop:
        stopped = True
        for section in report["sections"].values():
            if section["status"] == "cut" and not section["seconds"]:
                section["reason"] = f"{stop} before this section finished"
        report_format.write(report, out)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(report_format.summary_table(report))
    print(f"report: {paths[0]} and {paths[1].name}")
    failed = [n for n, s in report["sections"].items() if s["status"] == "failed"]
    problems = report_format.problems(report)
    for problem in problems:
        print(f"gpu-check: {problem}", file=sys.stderr)
    if failed:
        print(f"gpu-check: failed checks in {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or problems or stopped else 0


if __name__ == "__main__":
    sys.exit(main())
