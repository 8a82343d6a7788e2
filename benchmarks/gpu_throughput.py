"""GPU benchmark: transform() against the same layout written by hand with torch, on one GPU.

Issue 20's table, made fair by issue 28: step time, tokens/s, MFU and peak memory of a ~1.1B
Llama-style model (hidden 2048, 22 layers, 32/4 heads, intermediate 5632, vocab 32000, seq 2048,
batch 4; fp32 parameters and AdamW state, bf16 compute: ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` by hand, ``mixed_precision: "bf16"`` through transform()), on a world of
one rank. Each pair builds both sides from one seed and keeps them both on the device:

  torch      hand-written (gpu_common.by_hand): fully_shard on the input embedding, each block
             (reshard_after_forward=False, what transform() resolves on a world of one), the
             head (kept gathered) and the root; checkpoint_wrapper per block (``ac``), torch's
             save_on_cpu around each checkpointed block (``offload``), ``block.compile()``
             (``compile``), CPUOffloadPolicy (``cpu_offload``), torchao's float8 linears but the
             head (``fp8``), AdamW(fused=True) (``fused``)
  transform  the same keys through init() / transform()

Both sides' FSDP groups are read back after the warm-up and must be equal (module, parameter
count, reshard_after_forward, compute dtype, offload policy): the report states the layout, and a
pair whose sides differ is a failed check, not a figure. The timed steps interleave the sides,
A B / B A, `--rounds` rounds of `--steps-per-round` steps each, so that drift (clocks, heat,
other load) falls on both. The goals: issue 20's, ``ac_compile_fused`` step time <= 1.02x the
hand-written one; issue 47's, ``sac_compile_fused`` (selective checkpointing, ``sac``: torch's
``create_selective_checkpoint_contexts`` keeping every matmul and fused attention output, by
hand through ``checkpoint_wrapper(context_fn=...)``, ``activation_checkpointing: "selective"``
through transform()) at MFU >= 40 % and <= 1.02x the hand-written one. HF models are called
with ``use_cache=False`` on every side.

    python benchmarks/gpu_throughput.py --json gpu.json          # on a CUDA GPU
    python benchmarks/gpu_throughput.py --smoke                  # tiny model on CPU: checks the
                                                                 # script, no meaningful figures
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

import gpu_common as common

GOALS = {"sac_compile_fused": {"ratio": 1.02, "mfu": 0.40}, "ac_compile_fused": {"ratio": 1.02}}
"""Per pair: transform / torch step time at most `ratio`; transform's MFU at least `mfu`."""
PAIRS = ["sac_compile_fused", "ac_compile_fused", "compile_fused", "sac", "ac", "ac_fused",
         "fp8_compile_fused", "ac_offload_fused", "ac_cpu_offload_fused"]
"""The GPU table, the goals' pairs first (a budget cut leaves the later ones out)."""
EXTRA_PAIRS = ["none", "sac_fused"]
SMOKE_PAIRS = ["ac", "sac", "ac_fused", "none", "ac_offload_fused", "ac_cpu_offload_fused",
               "fp8_compile_fused"]
SIDES = ("torch", "transform")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(parser, seq_len=2048, batch_size=4, warmup=3, steps=3)
    parser.add_argument("--rounds", type=int, default=4,
                        help="interleaved rounds (A B, B A, ...); --steps steps per side each")
    parser.add_argument("--pairs", help=f"comma-separated subset of: "
                                        f"{', '.join(PAIRS + EXTRA_PAIRS)}")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no pair once this many seconds have passed")
    args = parser.parse_args(argv)
    common.shrink_for_smoke(args, layers=2, seq_len=32, warmup=1, steps=1)
    if args.smoke:
        args.rounds = 2
    names = args.pairs.split(",") if args.pairs else (SMOKE_PAIRS if args.smoke else PAIRS)
    unknown = sorted(set(names) - set(PAIRS + EXTRA_PAIRS))
    if unknown:
        parser.error(f"unknown pairs {unknown}; known: {', '.join(PAIRS + EXTRA_PAIRS)}")
    args.pair_list = names
    return args


def skip_reason(setup: str, device: torch.device) -> str | None:
    """Why pair `setup` cannot run here (the runtime's own refusal, for both sides), or None."""
    from meshtrain.contract.errors import ConfigError
    from meshtrain.contract.support import check_cpu_offload
    from meshtrain_runtime.parallel.float8 import check_fp8

    flags = common.setup_flags(setup)
    try:
        check_cpu_offload(flags["cpu_offload"], device.type)
        check_fp8(flags["fp8"], device)
    except ConfigError as refusal:
        return str(refusal)
    return None


@dataclass
class Side:
    """One side of a pair, built and warmed up, with what its timed steps recorded."""

    name: str
    model: nn.Module
    step: Callable[[], None]
    first_loss: float
    resident_bytes: int
    saved_activation_bytes: int | None
    times: list[float] = field(default_factory=list)
    peak_bytes: int = 0


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def build_side(side: str, setup: str, args: argparse.Namespace, device: torch.device) -> Side:
    """Build one side from seed 0, warm it up (compiling where asked), count its saved
    activations (uncompiled setups) and what it keeps on the device between steps."""
    from meshtrain_runtime.diagnostics.memory import measure_step_memory

    before = _allocated(device)
    prepare = common.by_hand if side == "torch" else common.through_transform
    model = prepare(setup, common.build_llama(args, device), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                  fused=True if common.setup_flags(setup)["fused"] else None)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    losses: list[float] = []

    def step() -> None:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not losses:
            losses.append(float(loss.detach()))

    common.timed_steps(step, max(1, args.warmup), device)
    memory = None if common.setup_flags(setup)["compile"] else \
        measure_step_memory(step, device=device)
    common.synchronize(device)
    return Side(f"{side}_{setup}", model, step, losses[0], _allocated(device) - before,
                memory.saved_activation_bytes if memory else None)


def interleave(sides: tuple[Side, Side], args: argparse.Namespace,
               device: torch.device) -> list[float]:
    """Rounds A B, B A, ...; returns each round's step-time ratio (second side / first)."""
    ratios = []
    for round_index in range(args.rounds):
        order = sides if round_index % 2 == 0 else sides[::-1]
        medians = {}
        for side in order:
            other = sides[1] if side is sides[0] else sides[0]
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = common.timed_steps(side.step, args.steps, device)
            side.times.extend(times)
            medians[side.name] = statistics.median(times)
            if device.type == "cuda":  # the other side's states sit idle on the device
                side.peak_bytes = max(side.peak_bytes, torch.cuda.max_memory_allocated(device)
                                      - other.resident_bytes)
        ratios.append(medians[sides[1].name] / medians[sides[0].name])
    return ratios


def side_result(side: Side, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from meshtrain_runtime.throughput import FlopCounter, peak_flops_per_device

    step_s = statistics.median(side.times)
    tokens_per_s = args.batch_size * args.seq_len / step_s
    flops = FlopCounter.build(side.model, seq_len=args.seq_len).per_token * tokens_per_s
    peak = peak_flops_per_device()
    return {"variant": side.name, "skipped": None, "first_loss": side.first_loss,
            "step_s": step_s, "step_s_spread": [min(side.times), max(side.times)],
            "tokens_per_s": tokens_per_s, "mfu": flops / peak if peak else None,
            "peak_allocated_bytes": side.peak_bytes if device.type == "cuda" else None,
            "saved_activation_bytes": side.saved_activation_bytes}


def run_pair(setup: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Both sides of `setup` built, checked for the same layout, timed interleaved."""
    reason = skip_reason(setup, device)
    if reason:
        return {"setup": setup, "skipped": reason,
                "results": {f"{s}_{setup}": {"variant": f"{s}_{setup}", "skipped": reason}
                            for s in SIDES}}
    torch._dynamo.reset()  # each pair compiles its own blocks afresh
    try:
        sides = tuple(build_side(side, setup, args, device) for side in SIDES)
        layout = common.check_same_layout(setup, sides[0].model, sides[1].model)
        ratios = interleave(sides, args, device)
    except common.LayoutMismatch as mismatch:  # a failed check: the pair compares nothing
        return {"setup": setup, "skipped": None, "failed": str(mismatch), "results": {}}
    except torch.cuda.OutOfMemoryError:
        return {"setup": setup, "skipped": "out of memory", "results": {
            f"{s}_{setup}": {"variant": f"{s}_{setup}", "skipped": "out of memory"}
            for s in SIDES}}
    results = {side.name: side_result(side, args, device) for side in sides}
    del sides
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"setup": setup, "skipped": None, "layout": layout,
            "layout_text": common.describe_layout(layout), "round_ratios": ratios,
            "results": results}


def comparison(pair: dict[str, Any]) -> dict[str, Any] | None:
    """transform / torch of a pair both sides ran: the median of the interleaved rounds'
    ratios with their spread, the median step times' ratio, memory and first-loss gaps."""
    if pair["skipped"] or pair.get("failed"):
        return None
    setup = pair["setup"]
    ours, theirs = pair["results"][f"transform_{setup}"], pair["results"][f"torch_{setup}"]
    ratios = pair["round_ratios"]
    row = {"setup": setup, "step_time_ratio": statistics.median(ratios),
           "round_ratio_spread": [min(ratios), max(ratios)],
           "median_step_ratio": ours["step_s"] / theirs["step_s"],
           "first_loss_difference": abs(ours["first_loss"] - theirs["first_loss"]),
           "layout": pair["layout_text"]}
    if ours["peak_allocated_bytes"] and theirs["peak_allocated_bytes"]:
        row["peak_memory_ratio"] = ours["peak_allocated_bytes"] / theirs["peak_allocated_bytes"]
    goal = GOALS.get(setup)
    if goal is not None:
        row["goal"] = f"<= {goal['ratio']}" + (f", MFU >= {goal['mfu']:.0%}" if "mfu" in goal
                                                else "")
        row["goal_met"] = row["step_time_ratio"] <= goal["ratio"]
        if "mfu" in goal:
            row["mfu"] = ours["mfu"]
            row["goal_met"] = row["goal_met"] and (ours["mfu"] or 0.0) >= goal["mfu"]
    return row


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(pairs: list[dict[str, Any]], device: str) -> str:
    """The markdown table (one row per side) and one comparison line per pair."""
    lines = [f"device: {device}", "", "| variant | step ms | tokens/s | MFU % | peak GiB |",
             "|---|---|---|---|---|"]
    for pair in pairs:
        for name, r in pair["results"].items():
            if r["skipped"]:
                lines.append(f"| {name} | skipped: {r['skipped']} | | | |")
                continue
            peak, mfu = r["peak_allocated_bytes"], r["mfu"]
            lines.append(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | "
                         f"{_cell(mfu and 100 * mfu, '.1f')} | "
                         f"{_cell(peak and peak / common.GIB, '.2f')} |")
        if pair.get("failed"):
            lines.append(f"| {pair['setup']} | FAILED: {pair['failed']} | | | |")
    lines.append("")
    for row in filter(None, map(comparison, pairs)):
        memory = row.get("peak_memory_ratio")
        mfu = f", MFU {100 * row['mfu']:.1f} %" if row.get("mfu") else ""
        goal = f" (goal {row['goal']}: {'met' if row['goal_met'] else 'missed'}{mfu})" \
            if "goal" in row else ""
        low, high = row["round_ratio_spread"]
        lines.append(f"transform / torch, {row['setup']}: step time x{row['step_time_ratio']:.3f}"
                     f" (rounds {low:.3f}..{high:.3f}){goal}"
                     + (f", peak memory x{memory:.3f}" if memory else "")
                     + f"; same layout: {row['layout']}")
    return "\n".join(lines)


def write_json(path: str | None, device: str, args: argparse.Namespace,
               pairs: list[dict[str, Any]]) -> None:
    if not path:
        return
    results = {name: r for pair in pairs for name, r in pair["results"].items()}
    payload = {"device": device, "args": vars(args), "pairs": pairs, "results": results,
               "comparisons": list(filter(None, map(comparison, pairs)))}
    Path(path).write_text(json.dumps(payload, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.require_gpu_unless_smoke("gpu_throughput.py", args.smoke):
        return 2
    import meshtrain_runtime as mr

    device = mr.init({}).device  # a world of one rank (the hand-written sides need its group)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    start, pairs = time.monotonic(), []
    for setup in args.pair_list:
        if args.budget_s is not None and time.monotonic() - start > args.budget_s:
            reason = f"budget: {args.budget_s:.0f} s spent before this pair"
            pairs.append({"setup": setup, "skipped": reason, "results": {
                f"{s}_{setup}": {"variant": f"{s}_{setup}", "skipped": reason} for s in SIDES}})
        else:
            pairs.append(run_pair(setup, args, device))
        write_json(args.json, label, args, pairs)  # after each pair: a cut run keeps the rest
    print(report(pairs, label))
    failed = [pair["failed"] for pair in pairs if pair.get("failed")]
    for message in failed:
        print(f"FAILED: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
