"""`meshtrain plan --goodput`: a job's expected goodput at scale, full restarts against replica
groups, and the checkpoint interval to use (goodput.py; `--simulate` adds the Monte Carlo check).

Examples::

    meshtrain plan --goodput --gpus 16384 --restart-seconds 300 --checkpoint-write-seconds 15
    meshtrain plan --goodput --gpus 100000 --replica-groups 48 --from-job my-ft-job --json

The times default to a fault-tolerant job's measurements with ``--from-job NAME`` (its
describe()["FaultTolerance"]["Measured"]: a group's restart and heal, the other groups' stall, a
checkpoint's write and load), else to the figures `GoodputInputs` names; a flag overrides both.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, fields
from typing import Any

from rich.console import Console
from rich.table import Table

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.goodput import (
    LLAMA3_GPU_MTBF_HOURS,
    GoodputEstimate,
    GoodputInputs,
    StrategyEstimate,
    estimate_goodput,
)
from meshtrain.plan.goodput_sim import simulate

_TIMES = ("restart_seconds", "checkpoint_write_seconds", "checkpoint_load_seconds",
          "checkpoint_interval_seconds", "group_restart_seconds", "heal_seconds",
          "stall_seconds")
_MEASURED = {"GroupRestartSeconds": "group_restart_seconds", "HealSeconds": "heal_seconds",
             "StallSeconds": "stall_seconds", "CheckpointWriteSeconds": "checkpoint_write_seconds",
             "CheckpointLoadSeconds": "checkpoint_load_seconds"}
SIMULATED_FAILURES = 20_000
CENTURY_SECONDS = 100 * 365.25 * 86400


def add_goodput_arguments(parser: argparse.ArgumentParser) -> None:
    """The --goodput options (the GPU count is --gpus, or --instance-type x --instance-count)."""
    group = parser.add_argument_group(
        "goodput (--goodput: expected goodput with failures, full restarts against replica "
        "groups, and the checkpoint interval; no model needed)")
    group.add_argument("--goodput", action="store_true", help="estimate goodput, not memory")
    group.add_argument("--gpu-mtbf-hours", type=float,
                       help=f"hours between failures of one GPU (default "
                            f"{LLAMA3_GPU_MTBF_HOURS:.0f}: Llama 3's 466 interruptions in 54 "
                            "days on 16,384 GPUs)")
    group.add_argument("--replica-groups", type=int,
                       help="fault-tolerant replica groups to compare with (default: none)")
    defaults = {f.name: f.default for f in fields(GoodputInputs)}
    for name in _TIMES:
        group.add_argument(f"--{name.replace('_', '-')}", type=float,
                           help=f"(default {defaults[name]})" if defaults[name] else
                           "(default: the recommended interval)")
    group.add_argument("--from-job", metavar="NAME",
                       help="default the times to what this fault-tolerant job measured")
    group.add_argument("--simulate", action="store_true",
                       help=f"also simulate {SIMULATED_FAILURES} failures (seeded) and show "
                            "the simulated goodput beside the closed form")
    group.add_argument("--job-days", type=float,
                       help="the job's length: how many restarts each group should expect")


def inputs_from_args(args: argparse.Namespace, gpus: int,
                     measured: dict[str, Any] | None = None) -> GoodputInputs:
    """GoodputInputs from flags, over a job's measured times, over the defaults."""
    values: dict[str, Any] = {"gpus": gpus}
    origin: dict[str, str] = {}
    for key, name in _MEASURED.items():
        if measured and measured.get(key) is not None:
            values[name] = float(measured[key])
            origin[name] = f"measured by {args.from_job}"
    for name in ("gpu_mtbf_hours", "replica_groups", *_TIMES):
        given = getattr(args, name, None)
        if given is not None:
            values[name] = given
            origin.pop(name, None)
    return GoodputInputs(**values, measured=origin)


def measured_of_job(name: str) -> dict[str, Any]:
    """describe()["FaultTolerance"]["Measured"] of the job `name` (found on any backend)."""
    from meshtrain.registry import find_job

    figures = find_job(name).describe().get("FaultTolerance")
    if not figures or not figures.get("Measured"):
        raise ConfigError(f"--from-job {name}: the job has no fault-tolerance measurements "
                          "(describe()['FaultTolerance']['Measured']); run it with "
                          "torch_distributed.fault_tolerance, or give the times as flags.")
    return figures["Measured"]


def run_goodput(args: argparse.Namespace, gpus: int) -> int:
    """Print (or --json) the estimate for `gpus` GPUs; 0."""
    measured = measured_of_job(args.from_job) if args.from_job else None
    estimate = estimate_goodput(inputs_from_args(args, gpus, measured))
    simulated = _simulated(estimate) if args.simulate else {}
    if args.json:
        print(json.dumps(goodput_to_dict(estimate, simulated, args.job_days), indent=2))
    else:
        render_goodput(estimate, Console(), simulated, args.job_days)
    return 0


def _simulated(estimate: GoodputEstimate) -> dict[str, float]:
    out = {}
    for strategy in _strategies(estimate):
        inputs = estimate.inputs if strategy.replica_groups > 1 else GoodputInputs(
            **{**asdict(estimate.inputs), "replica_groups": 1})
        out[strategy.name] = simulate(inputs, strategy.checkpoint_interval_seconds,
                                      failures=SIMULATED_FAILURES)
    return out


def _strategies(estimate: GoodputEstimate) -> list[StrategyEstimate]:
    return [estimate.full_restarts, *([estimate.replica_groups] if estimate.replica_groups
                                      else [])]


def goodput_to_dict(estimate: GoodputEstimate, simulated: dict[str, float],
                    job_days: float | None = None) -> dict[str, Any]:
    """The estimate as JSON-able data (the inputs, each strategy, which is best)."""
    inputs = asdict(estimate.inputs)
    return {
        "inputs": {**{k: v for k, v in inputs.items() if k != "measured"},
                   "job_mtbf_seconds": estimate.inputs.job_mtbf_seconds},
        "measured_inputs": estimate.inputs.measured,
        "failures_per_day": estimate.failures_per_day,
        "restarts_per_group": _per_group(estimate, job_days),
        "strategies": [{**asdict(s), "simulated_goodput": simulated.get(s.name)}
                       for s in _strategies(estimate)],
        "best": estimate.best.name,
    }


def _per_group(estimate: GoodputEstimate, job_days: float | None) -> float | None:
    per_day = estimate.restarts_per_group_per_day
    if per_day is None:
        return None
    return per_day * (job_days or 1.0)


def render_goodput(estimate: GoodputEstimate, console: Console,
                   simulated: dict[str, float], job_days: float | None = None) -> None:
    inputs = estimate.inputs
    console.print(f"{inputs.gpus:,} GPUs, one failure per {inputs.gpu_mtbf_hours:,.0f} GPU-hours: "
                  f"a failure every {_duration(inputs.job_mtbf_seconds)} "
                  f"({estimate.failures_per_day:.1f} a day)")
    table = Table(show_header=True)
    for column in ("strategy", "goodput", "checkpoint every", "recommended",
                   "whole-job restarts"):
        table.add_column(column)
    if simulated:
        table.add_column("simulated")
    for strategy in _strategies(estimate):
        row = [strategy.name, f"{strategy.goodput:.1%}",
               _duration(strategy.checkpoint_interval_seconds),
               _duration(strategy.recommended_interval_seconds),
               _every(strategy.restart_mtbf_seconds)]
        if simulated:
            row.append(f"{simulated[strategy.name]:.1%}")
        table.add_row(*row)
    console.print(table)
    for name, where in sorted(inputs.measured.items()):
        console.print(f"{name}: {getattr(inputs, name)} s ({where})")
    per_group = _per_group(estimate, job_days)
    if per_group is not None:
        span = f"over {job_days:g} days" if job_days else "a day"
        console.print(f"Each replica group restarts {per_group:.1f} times {span}: set "
                      "torch_distributed.max_restarts at least that high.")


def _every(seconds: float) -> str:
    return "none in 100 years" if seconds > CENTURY_SECONDS else f"every {_duration(seconds)}"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds > CENTURY_SECONDS:
        return "over 100 years"
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


__all__ = ["add_goodput_arguments", "goodput_to_dict", "inputs_from_args", "render_goodput",
           "run_goodput"]
