"""Aggregation and rendering of `make bench` results (pure functions, no torch, no timing).

`benchmarks/run_all.py` collects raw measurements (the ``RESULT`` lines of overhead.py, the JSON
of bench_tp_comm.py and bench_ep_alltoall.py, launch timings) and this module turns them into
benchmarks/results/latest.json and its markdown table. Kept apart so that
tests/benchmarks/test_report.py can check the arithmetic on hand-made inputs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

OVERHEAD_GOAL = 1.03
LAUNCH_GOAL = 1.2


def summarize_ratios(ratios: Sequence[float]) -> dict[str, Any]:
    """Median of per-round ratios and their spread (quartiles, min, max, count)."""
    if not ratios:
        raise ValueError("no ratios to summarise")
    values = sorted(float(r) for r in ratios)
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {
        "median": statistics.median(values),
        "q1": q1,
        "q3": q3,
        "min": values[0],
        "max": values[-1],
        "n": len(values),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def collective_totals(per_op: Mapping[str, int] | None) -> int | None:
    """Sum of payload bytes over all (phase, op) keys; None when not measured."""
    if per_op is None:
        return None
    return int(sum(per_op.values()))


def layout_entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    """One layout's record: overhead ratio and spread (wall time; CPU time beside it when
    measured), memory and collectives vs theory."""
    spread = summarize_ratios(raw["round_ratios"])
    cpu = summarize_ratios(raw["cpu_round_ratios"]) if raw.get("cpu_round_ratios") else None
    memory = raw["memory"]
    comm = raw.get("collective_bytes") or {}
    measured = collective_totals(comm.get("transform"))
    by_hand = collective_totals(comm.get("by_hand"))
    theory = collective_totals(comm.get("theory"))
    return {
        "layout": raw["layout"],
        "null": bool(raw.get("null", False)),
        "ranks": raw["ranks"],
        "mesh": raw["mesh"],
        "parameters": raw["parameters"],
        "overhead_ratio": spread["median"],
        "overhead_spread": {k: spread[k] for k in ("q1", "q3", "min", "max", "n")},
        "cpu_overhead_ratio": cpu["median"] if cpu else None,
        "cpu_overhead_spread": {k: cpu[k] for k in ("q1", "q3", "min", "max", "n")} if cpu
        else None,
        "step_ms": raw["step_ms"],
        "plain_parameters": raw.get("plain_parameters"),
        "memory": {
            **memory,
            "over_theory": _ratio(memory["transform_bytes"], memory["theory_bytes"]),
            "over_by_hand": _ratio(memory["transform_bytes"], memory["by_hand_bytes"]),
        },
        "collectives": {
            "transform_bytes": measured,
            "by_hand_bytes": by_hand,
            "theory_bytes": theory,
            "over_theory": _ratio(measured, theory),
            "over_by_hand": _ratio(measured, by_hand),
            "per_op": comm,
        },
    }


def launch_entry(fit_s: Sequence[float], torchrun_s: Sequence[float]) -> dict[str, Any]:
    """Launch overhead from interleaved pairs: per-pair ratio fit / torchrun, its spread."""
    if len(fit_s) != len(torchrun_s):
        raise ValueError(f"{len(fit_s)} fit() timings but {len(torchrun_s)} torchrun timings")
    spread = summarize_ratios([f / t for f, t in zip(fit_s, torchrun_s, strict=True)])
    return {
        "overhead_ratio": spread["median"],
        "overhead_spread": {k: spread[k] for k in ("q1", "q3", "min", "max", "n")},
        "fit_s": list(fit_s),
        "torchrun_s": list(torchrun_s),
        "median_fit_s": statistics.median(fit_s),
        "median_torchrun_s": statistics.median(torchrun_s),
    }


def tp_comm_entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    """bench_tp_comm.py's JSON: ring bytes per rank of meshtrain, torch and Megatron's theory."""
    out = {}
    for name, result in raw["results"].items():
        ours = result["meshtrain"]["ring_bytes_per_rank"]
        theory = result["expected"]["ring_bytes_per_rank"]
        out[name] = {
            "meshtrain_ring_bytes": ours,
            "torch_ring_bytes": result["torch"]["ring_bytes_per_rank"],
            "theory_ring_bytes": theory,
            "over_theory": _ratio(ours, theory),
        }
    return out


def ep_comm_entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    """bench_ep_alltoall.py's JSON: token all-to-all bytes per step vs the routed theory."""
    return {
        "measured_bytes_per_step": raw["measured_bytes_per_step"],
        "theory_bytes_per_step": raw["theoretical_bytes_per_step"],
        "over_theory": raw["measured_over_theoretical"],
    }


def build_report(
    layouts: Sequence[Mapping[str, Any]],
    *,
    machine: Mapping[str, Any],
    launch: Mapping[str, Any] | None = None,
    tp_comm: Mapping[str, Any] | None = None,
    ep_comm: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The latest.json document; `goals_met` compares against the issue's acceptance bounds."""
    entries = [layout_entry(raw) for raw in layouts]
    report: dict[str, Any] = {
        "machine": dict(machine),
        "layouts": {entry["layout"]: entry for entry in entries},
        "launch": dict(launch) if launch else None,
        "tp_collectives": tp_comm_entry(tp_comm) if tp_comm else None,
        "ep_all_to_all": ep_comm_entry(ep_comm) if ep_comm else None,
    }
    measured = [e for e in entries if not e["null"]]
    report["goals_met"] = {
        # a null layout (hand-written vs hand-written) is the method's floor, not a goal
        "overhead_ratio_le_1.03": all(e["overhead_ratio"] <= OVERHEAD_GOAL for e in measured),
        "launch_le_1.2": None if not launch else launch["overhead_ratio"] <= LAUNCH_GOAL,
    }
    return report


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cpu_cell(entry: Mapping[str, Any]) -> str:
    spread = entry.get("cpu_overhead_spread")
    if not spread:
        return "-"
    return (f"{_fmt(entry['cpu_overhead_ratio'])} "
            f"({_fmt(spread['q1'])}..{_fmt(spread['q3'])})")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The markdown table of a report (what run_all.py prints and writes next to the JSON)."""
    machine = report["machine"]
    lines = [
        f"Machine: {machine.get('description', '?')} ({machine.get('cpus', '?')} CPUs, "
        f"torch {machine.get('torch', '?')}, load average (1 min) {machine.get('load', '?')})",
        "",
        "| layout | ranks | overhead ratio | q1..q3 | CPU-time ratio (q1..q3) "
        "| step ms (transform / by hand) | param bytes/rank vs theory "
        "| collective bytes vs theory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in report["layouts"].items():
        spread = entry["overhead_spread"]
        step = entry["step_ms"]
        label = f"{name} (hand-written vs itself)" if entry.get("null") else name
        lines.append(
            f"| {label} | {entry['ranks']} | {_fmt(entry['overhead_ratio'])} | "
            f"{_fmt(spread['q1'])}..{_fmt(spread['q3'])} | {_cpu_cell(entry)} | "
            f"{step['transform']:.1f} / {step['by_hand']:.1f} | "
            f"{_fmt(entry['memory']['over_theory'], 4)} | "
            f"{_fmt(entry['collectives']['over_theory'], 4)} |"
        )
    launch = report.get("launch")
    if launch:
        spread = launch["overhead_spread"]
        lines += ["", f"Launch: fit() / raw torchrun = {_fmt(launch['overhead_ratio'])} "
                  f"(q1..q3 {_fmt(spread['q1'])}..{_fmt(spread['q3'])}; "
                  f"{launch['median_fit_s']:.2f} s vs {launch['median_torchrun_s']:.2f} s)"]
    for name, entry in (report.get("tp_collectives") or {}).items():
        lines.append(f"TP ({name}): ring bytes/rank vs Megatron = {_fmt(entry['over_theory'], 4)}")
    ep = report.get("ep_all_to_all")
    if ep:
        lines.append(f"EP all-to-all bytes vs routed theory = {_fmt(ep['over_theory'], 4)}")
    return "\n".join(lines) + "\n"


__all__ = [
    "build_report",
    "collective_totals",
    "ep_comm_entry",
    "launch_entry",
    "layout_entry",
    "render_markdown",
    "summarize_ratios",
    "tp_comm_entry",
]
