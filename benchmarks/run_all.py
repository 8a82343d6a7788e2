"""`make bench`: every CPU benchmark in one command; writes benchmarks/results/latest.{json,md}.

    python benchmarks/run_all.py            # the full run (CPU, gloo; minutes)
    python benchmarks/run_all.py --smoke    # one tiny layout end to end (a test runs this)

Steps: overhead.py on 4 ranks (the null layout: hand-written full shard against itself, the
method's floor; full shard, hybrid 2x2, tp 4, ep 2; with --with-compile also full shard, hybrid,
tp and ep with ``compile: true`` on both sides) and on 8 ranks (its own null layout, the
hand-written tp 2 x shard 2 x replicate 2 against itself; that layout, and compiled with
--with-compile); bench_tp_comm.py (TP collective bytes vs Megatron's formulas);
bench_ep_alltoall.py (EP all-to-all bytes vs the routed theory); bench_pipeline.py (pp2:
transform() + forward_backward vs hand-written torch.distributed.pipelining, and the bubble of
each schedule vs theory; its smoke path is tests/benchmarks/test_bench_pipeline.py's);
bench_context.py (cp2: attention bytes per cp_comm_type vs the planner, and the cp attention's
step time vs a hand-written all_gather + SDPA; its smoke path is test_bench_context.py's);
bench_data.py (the loader's tokens/s vs DataLoader + DistributedSampler, and the step time of a
model fed by it vs in memory; one process; its smoke path is test_bench_data.py's);
launch_overhead.py (fit() vs raw torchrun, both fresh processes). Every launch goes through
torchrun and meshtrain's rank entry with OMP_NUM_THREADS=1. The load average is recorded at
the start and the end. Aggregation lives in report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402  (a sibling module of this script, not a package)

# The timed model. At hidden 64 / seq 32 a step (~60 ms on 4 ranks of 2 cores) is mostly gloo
# round trips and the scheduler: the median of 40 rounds moved by up to 0.12 between runs of the
# same code (benchmarks/RESULTS.md, runs 3-5). At hidden 256 / seq 128 (~200 ms) no layout's
# median moved by more than 0.035 in five runs (runs 6-10). The smoke run keeps the tiny model.
MODEL = ["--hidden", "256", "--layers", "2", "--seq", "128", "--batch", "2"]
SMOKE_MODEL = ["--hidden", "64", "--layers", "2", "--seq", "32", "--batch", "2"]
# A full run's layouts per launch (each launch starts with its null layout, the floor of the
# layouts beside it) and the fewest interleaved pairs a full run accepts.
FULL_4 = "null_full_shard,full_shard,hybrid,tp,ep"
FULL_4_COMPILE = "full_shard_compile,hybrid_compile,tp_compile,ep_compile"
FULL_8 = "null_tp_x_hybrid,tp_x_hybrid"
SMOKE_2 = "null_full_shard,full_shard,tp,ep"
MIN_PAIRS = 10


def environment() -> dict[str, str]:
    """This checkout's sdk/ and runtime/ first on PYTHONPATH, one thread per rank."""
    paths = [str(ROOT / "sdk"), str(ROOT / "runtime")]
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])),
            "OMP_NUM_THREADS": "1"}


def torchrun(ranks: int, script: Path, args: list[str], timeout: int) -> str:
    """Run `script` on `ranks` local processes; return stdout (raises on failure)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", "-m", "meshtrain_runtime.host.rank_entry",
               str(script), *args]
    done = subprocess.run(command, env=environment(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} on {ranks} ranks failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def overhead(ranks: int, layouts: str, rounds: int, timeout: int,
             model: list[str] = MODEL) -> list[dict[str, Any]]:
    out = torchrun(ranks, HERE / "overhead.py",
                   ["--layouts", layouts, "--rounds", str(rounds), *model], timeout)
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines()
               if line.startswith("RESULT ")]
    if len(results) != len(layouts.split(",")):
        raise RuntimeError(f"expected {layouts} results, got {len(results)}:\n{out[-3000:]}")
    return results


def json_of(script: str, args: list[str], timeout: int) -> dict[str, Any]:
    """Run a self-launching benchmark that writes --json; return what it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        done = subprocess.run([sys.executable, str(HERE / script), *args, "--json", str(path)],
                              env=environment(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"{script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(path.read_text())


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(description: str, load_start: list[float] | None) -> dict[str, Any]:
    """The machine, its load average at the start (given) and now, and whether it was loaded."""
    import torch

    load_end, cpus = load_average(), os.cpu_count() or 1
    return {"description": description, "cpus": cpus, "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "load_start": load_start, "load_end": load_end,
            "loaded": is_loaded(load_start, load_end, cpus=cpus)}


def is_loaded(load_start: list[float] | None, load_end: list[float] | None, *, cpus: int) -> bool:
    """More runnable processes than CPUs (1-minute load average) at the start or the end."""
    return any(load is not None and load[0] > cpus for load in (load_start, load_end))


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_start = load_average()
    if args.smoke:
        layouts = overhead(2, SMOKE_2, 2, timeout=300, model=SMOKE_MODEL)
        return report.build_report(layouts, machine=machine(args.machine, load_start))
    rounds = args.rounds
    layouts = overhead(4, FULL_4, rounds, timeout=1800)
    if args.with_compile:  # inductor compiles every block on every rank: minutes on 2 cores
        layouts += overhead(4, FULL_4_COMPILE, rounds, timeout=1800)
    layouts += overhead(8, FULL_8 + ",tp_x_hybrid_compile" if args.with_compile else FULL_8,
                        rounds, timeout=1800)
    tp = json_of("bench_tp_comm.py", ["--tp", "2", "--layers", "2", "--hidden", "64",
                                      "--intermediate", "128", "--vocab", "512",
                                      "--seq-len", "32", "--steps", "1"], timeout=600)
    ep = json_of("bench_ep_alltoall.py", ["--ranks", "2", "--ep", "2", "--tokens", "128",
                                          "--hidden", "64", "--intermediate", "128",
                                          "--steps", "2"], timeout=600)
    # TP x EP: the tp pair shares its tokens and each rank dispatches half (issue 32)
    ep_tp = json_of("bench_ep_alltoall.py", ["--ranks", "2", "--tp", "2", "--ep", "2",
                                             "--tokens", "128", "--hidden", "64",
                                             "--intermediate", "128", "--steps", "2"],
                    timeout=600)
    # a pipelined step is ~0.5 s here (3 sides x 2 steps a round): a quarter of the rounds,
    # never fewer than MIN_PAIRS
    pipeline = json_of("bench_pipeline.py", ["--rounds", str(max(MIN_PAIRS, rounds // 4))],
                       timeout=1800)
    context = json_of("bench_context.py", ["--rounds", str(max(MIN_PAIRS, rounds // 4))],
                      timeout=1800)
    data = json_of("bench_data.py", [], timeout=1800)
    from launch_overhead import measure_launch

    launch = report.launch_entry(measure_launch(args.launch_pairs, environment()))
    return report.build_report(layouts, machine=machine(args.machine, load_start),
                               launch=launch, tp_comm=tp, ep_comm=ep, ep_tp_comm=ep_tp,
                               pipeline=pipeline, context=context, data=data)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; a full run takes at least MIN_PAIRS interleaved pairs of each kind."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="null, full shard, tp and ep of a tiny model on 2 ranks, 2 rounds")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds per layout")
    parser.add_argument("--launch-pairs", type=int, default=MIN_PAIRS,
                        help="interleaved launch rounds (fit, torchrun, torchrun again)")
    parser.add_argument("--with-compile", action="store_true",
                        help="also full shard, hybrid, tp, tp x hybrid and ep with compile: true "
                        "on both sides")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--machine", default="unnamed machine",
                        help="a description of this machine, recorded with the figures")
    args = parser.parse_args(argv)
    if not args.smoke and min(args.rounds, args.launch_pairs) < MIN_PAIRS:
        parser.error(f"--rounds {args.rounds} / --launch-pairs {args.launch_pairs}: a full run "
                     f"needs at least {MIN_PAIRS} interleaved pairs of each (fewer cannot tell a "
                     "3 % overhead from the noise here); use --smoke for a quick check")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(environment())  # fit()'s local job inherits this checkout's paths
    sys.path[:0] = [str(ROOT / "sdk"), str(ROOT / "runtime")]
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    table = report.render_markdown(result)
    (args.out / "latest.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
