"""`make bench`: every CPU benchmark in one command; writes benchmarks/results/latest.{json,md}.

    python benchmarks/run_all.py            # the full run (CPU, gloo; minutes)
    python benchmarks/run_all.py --smoke    # one tiny layout end to end (a test runs this)

Steps: overhead.py on 4 ranks (the null layout: hand-written full shard against itself, the
method's floor; full shard, hybrid 2x2, tp 4, ep 2; with --with-compile also full shard, hybrid,
tp and ep with ``compile: true`` on both sides) and on 8 ranks (tp 2 x shard 2 x replicate 2,
and compiled with --with-compile); bench_tp_comm.py (TP collective bytes vs Megatron's formulas);
bench_ep_alltoall.py (EP all-to-all bytes vs the routed theory); launch_overhead.py (fit() vs
raw torchrun). Every launch goes through torchrun and meshtrain's rank entry with
OMP_NUM_THREADS=1. Aggregation lives in report.py.
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


def machine(description: str) -> dict[str, Any]:
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"description": description, "cpus": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "load": None if load is None else round(load, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rounds = 2 if args.smoke else args.rounds
    if args.smoke:
        layouts = overhead(2, "full_shard,tp", rounds, timeout=300, model=SMOKE_MODEL)
        return report.build_report(layouts, machine=machine(args.machine))
    layouts = overhead(4, "null_full_shard,full_shard,hybrid,tp,ep", rounds, timeout=900)
    if args.with_compile:  # inductor compiles every block on every rank: minutes on 2 cores
        layouts += overhead(4, "full_shard_compile,hybrid_compile,tp_compile,ep_compile", rounds,
                            timeout=900)
    layouts += overhead(8, "tp_x_hybrid,tp_x_hybrid_compile" if args.with_compile
                        else "tp_x_hybrid", rounds, timeout=900)
    tp = json_of("bench_tp_comm.py", ["--tp", "2", "--layers", "2", "--hidden", "64",
                                      "--intermediate", "128", "--vocab", "512",
                                      "--seq-len", "32", "--steps", "1"], timeout=600)
    ep = json_of("bench_ep_alltoall.py", ["--ranks", "2", "--ep", "2", "--tokens", "128",
                                          "--hidden", "64", "--intermediate", "128",
                                          "--steps", "2"], timeout=600)
    from launch_overhead import measure_launch

    fit_s, torchrun_s = measure_launch(args.launch_pairs, environment())
    return report.build_report(layouts, machine=machine(args.machine),
                               launch=report.launch_entry(fit_s, torchrun_s),
                               tp_comm=tp, ep_comm=ep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="full shard and tp of a tiny model on 2 ranks, 2 rounds")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved rounds per layout")
    parser.add_argument("--launch-pairs", type=int, default=3)
    parser.add_argument("--with-compile", action="store_true",
                        help="also full shard, hybrid, tp, tp x hybrid and ep with compile: true "
                        "on both sides")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--machine", default="unnamed machine",
                        help="a description of this machine, recorded with the figures")
    args = parser.parse_args(argv)
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
