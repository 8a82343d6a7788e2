"""GPU benchmark: transform() against the same layout written by hand with torch, on one GPU.

Issue 20's table: step time, tokens/s, MFU and peak memory of a ~1.1B Llama-style model
(hidden 2048, 22 layers, 32/4 heads, intermediate 5632, vocab 32000, seq 2048, batch 4; fp32
parameters and AdamW state, bf16 compute: ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` by hand, ``mixed_precision: "bf16"`` through transform()). Each variant is
built fresh from one seed in this process (a world of one rank):

  torch_*        hand-written: checkpoint_wrapper per block (``_ac``), ``block.compile()`` per
                 block (``_compile``), then fully_shard per block and on the root (torchtitan's
                 order), AdamW; ``_fused``: AdamW(fused=True)
  transform_*    the same through init() / transform(): activation_checkpointing, compile
  *_fp8_compile_fused          torchao's float8 linears (by hand: convert_to_float8_training
                               but the head; ``fp8: true``), compiled, fused AdamW; needs
                               torchao and compute capability 9.0+
  transform_ac_offload_fused   checkpointing + activation_offloading, fused AdamW
  transform_cpu_offload_fused  cpu_offload (parameters, gradients, optimizer state on the host)

The comparisons print transform / torch for the same setup; the goal (issue 20): with compile
and checkpointing, transform()'s step time <= 1.02x the hand-written compiled one. HF models
are called with ``use_cache=False`` on every side (a KV cache would cost ~2 GiB here).

    python benchmarks/gpu_throughput.py --json gpu.json          # on a CUDA GPU
    python benchmarks/gpu_throughput.py --smoke                  # tiny model on CPU: checks the
                                                                 # script, no meaningful figures
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

import gpu_common as common

PAIRS = ["ac", "ac_fused", "ac_compile_fused", "compile_fused", "none", "fp8_compile_fused"]
GOAL = ("ac_compile_fused", 1.02)
VARIANTS = [*(f"{side}_{setup}" for setup in PAIRS for side in ("torch", "transform")),
            "transform_ac_offload_fused", "transform_cpu_offload_fused"]
SMOKE_VARIANTS = [*(f"{side}_{setup}" for setup in ("ac", "ac_fused", "none")
                    for side in ("torch", "transform")),
                  "transform_ac_offload_fused", "transform_cpu_offload_fused",
                  "torch_fp8_compile_fused", "transform_fp8_compile_fused"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(parser, seq_len=2048, batch_size=4, warmup=3, steps=10)
    parser.add_argument("--variants", help=f"comma-separated subset of: {', '.join(VARIANTS)}")
    args = parser.parse_args(argv)
    common.shrink_for_smoke(args, layers=2, seq_len=32, warmup=1, steps=2)
    names = args.variants.split(",") if args.variants else (
        SMOKE_VARIANTS if args.smoke else VARIANTS)
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    args.variant_list = names
    return args


def skip_reason(name: str, device: torch.device) -> str | None:
    """Why variant `name` cannot run here (the runtime's own refusal, for either side), or None."""
    from meshtrain.contract.errors import ConfigError
    from meshtrain.contract.support import check_cpu_offload
    from meshtrain_runtime.parallel.float8 import check_fp8

    try:
        check_cpu_offload("cpu_offload" in name, device.type)
        check_fp8("fp8" in name, device)
    except ConfigError as refusal:
        return str(refusal)
    return None


def by_hand(name: str, model: nn.Module, device: torch.device) -> nn.Module:
    """torchtitan's order written out: float8, checkpointing, compile per block, fully_shard."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if "fp8" in name:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "lm_head")
    block_type = type(model.model.layers[0])
    if "_ac" in name:
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda module: isinstance(module, block_type))
    if "compile" in name:
        for block in model.model.layers:
            block.compile()
    mesh = init_device_mesh(device.type, (1,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if device.type == "cuda" else MixedPrecisionPolicy()
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def through_transform(name: str, model: nn.Module, device: torch.device) -> nn.Module:
    import meshtrain_runtime as mr

    params: dict[str, Any] = {
        "activation_checkpointing": "_ac" in name,
        "compile": "compile" in name,
        "activation_offloading": "_ac_offload" in name,
        "cpu_offload": "cpu_offload" in name,
        "fp8": "fp8" in name,
    }
    if device.type == "cuda":
        params["mixed_precision"] = "bf16"
    mr.reset()
    mr.init(params)
    return mr.transform(model)


def make_step(model: nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor,
              losses: list[float]) -> Callable[[], None]:
    def step() -> None:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not losses:
            losses.append(float(loss.detach()))

    return step


def run_variant(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Build variant `name`; warm up (compiling where asked), measure one step's memory, then
    time `args.steps` steps."""
    from meshtrain_runtime.diagnostics.memory import measure_step_memory
    from meshtrain_runtime.throughput import FlopCounter, peak_flops_per_device

    reason = skip_reason(name, device)
    if reason:
        return {"variant": name, "skipped": reason}
    prepare = by_hand if name.startswith("torch_") else through_transform
    model = prepare(name, common.build_llama(args, device), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                  fused=True if name.endswith("_fused") else None)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    losses: list[float] = []
    step = make_step(model, optimizer, ids, losses)
    try:
        common.timed_steps(step, args.warmup, device)
        memory = measure_step_memory(step, device=device) if "compile" not in name else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = common.timed_steps(step, args.steps, device)
    except torch.cuda.OutOfMemoryError:
        return {"variant": name, "skipped": "out of memory"}
    step_s = statistics.median(times)
    tokens_per_s = args.batch_size * args.seq_len / step_s
    flops = FlopCounter.build(model, seq_len=args.seq_len).per_token * tokens_per_s
    peak = peak_flops_per_device()
    return {
        "variant": name, "skipped": None, "first_loss": losses[0], "step_s": step_s,
        "tokens_per_s": tokens_per_s, "mfu": flops / peak if peak else None,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda" else None,
        "saved_activation_bytes": memory.saved_activation_bytes if memory else None,
    }


def comparisons(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """transform / torch for every setup both sides ran."""
    rows = []
    for setup in PAIRS:
        ours, theirs = results.get(f"transform_{setup}"), results.get(f"torch_{setup}")
        if not ours or not theirs or ours["skipped"] or theirs["skipped"]:
            continue
        row = {"setup": setup, "step_time_ratio": ours["step_s"] / theirs["step_s"],
               "first_loss_difference": abs(ours["first_loss"] - theirs["first_loss"])}
        if ours["peak_allocated_bytes"] and theirs["peak_allocated_bytes"]:
            row["peak_memory_ratio"] = ours["peak_allocated_bytes"] / theirs["peak_allocated_bytes"]
        if setup == GOAL[0]:
            row["goal"] = f"<= {GOAL[1]}"
            row["goal_met"] = row["step_time_ratio"] <= GOAL[1]
        rows.append(row)
    return rows


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(results: dict[str, dict[str, Any]], rows: list[dict[str, Any]], device: str) -> str:
    lines = [f"device: {device}", "", "| setup | step ms | tokens/s | MFU % | peak GiB |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        if r["skipped"]:
            lines.append(f"| {name} | skipped: {r['skipped']} | | | |")
            continue
        peak, mfu = r["peak_allocated_bytes"], r["mfu"]
        lines.append(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | "
                     f"{_cell(mfu and 100 * mfu, '.1f')} | "
                     f"{_cell(peak and peak / common.GIB, '.2f')} |")
    lines.append("")
    for row in rows:
        memory = row.get("peak_memory_ratio")
        goal = f" (goal {row['goal']}: {'met' if row['goal_met'] else 'missed'})" \
            if "goal" in row else ""
        lines.append(f"transform / torch, {row['setup']}: step time "
                     f"x{row['step_time_ratio']:.3f}{goal}"
                     + (f", peak memory x{memory:.3f}" if memory else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.require_gpu_unless_smoke("gpu_throughput.py", args.smoke):
        return 2
    import meshtrain_runtime as mr

    device = mr.init({}).device  # a world of one rank (the hand-written sides need its group)
    results = {}
    for name in args.variant_list:
        torch._dynamo.reset()  # each compiled variant compiles its own blocks afresh
        results[name] = run_variant(name, args, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows = comparisons(results)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(report(results, rows, label))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": label, "args": vars(args),
                       "results": results, "comparisons": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
