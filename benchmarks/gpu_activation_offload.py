"""GPU benchmark: peak memory and step time of activation checkpointing and offloading.

A ~1.1B-parameter Llama-style model (TinyLlama shape: hidden 2048, 22 layers, GQA 32/4 heads,
bf16) runs forward + backward on one GPU under each variant, each built fresh from one seed:

  torch_none                 no checkpointing (may run out of memory at long sequences)
  torch_ac                   hand-written torch: checkpoint_wrapper (non-reentrant) per block
  meshtrain_ac               apply_activation_checkpointing(model, blocks)
  torch_ac_offload           hand-written torch: torch_ac + offload_wrapper (save_on_cpu on the
                             root, SMP's documented native recipe)
  meshtrain_offload_native   meshtrain with sm_activation_offloading=False (save_on_cpu per block)
  meshtrain_offload_h{H}     meshtrain's own offloader, activation_loading_horizon=H

It prints peak allocated memory and the median step time of each, and the ratios meshtrain /
hand-written torch measured in the same run. Needs CUDA; ``--smoke`` runs a tiny model on
whatever device exists to check the script itself (its numbers mean nothing).

    python benchmarks/gpu_activation_offload.py --seq-len 4096 --batch-size 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

import gpu_common as common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(parser, seq_len=4096, batch_size=2, warmup=2, steps=5)
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args(argv)
    common.shrink_for_smoke(args, layers=3, seq_len=64, warmup=0, steps=1)
    return args


def build_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The benchmark's Llama in bf16 on a GPU (no optimizer here: no fp32 master copy)."""
    model = common.build_llama(args, device)
    return model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)


def apply_variant(name: str, model: nn.Module) -> nn.Module:
    """Return the model prepared as variant `name` (torch_* are written with torch alone)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
        offload_wrapper,
    )
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing as torch_apply_activation_checkpointing,
    )

    from meshtrain_runtime.parallel.activations import apply_activation_checkpointing

    blocks = list(model.model.layers)
    block_type = type(blocks[0])
    if name.startswith("torch_ac"):
        torch_apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=partial(checkpoint_wrapper,
                                          checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda module: isinstance(module, block_type),
        )
        return offload_wrapper(model) if name == "torch_ac_offload" else model
    if name == "meshtrain_ac":
        return apply_activation_checkpointing(model, blocks)
    if name == "meshtrain_offload_native":
        return apply_activation_checkpointing(model, blocks, offload=True, native_offload=True)
    if name.startswith("meshtrain_offload_h"):
        horizon = int(name.removeprefix("meshtrain_offload_h"))
        return apply_activation_checkpointing(model, blocks, offload=True,
                                              loading_horizon=horizon)
    if name == "torch_none":
        return model
    raise ValueError(f"unknown variant {name}")


def make_step(model: nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        model.zero_grad(set_to_none=True)

    return step


def run_variant(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Build variant `name`, run warm-up, one measured step for memory, then timed steps."""
    from meshtrain_runtime.diagnostics.memory import measure_step_memory
    from meshtrain_runtime.parallel.activations import get_offload_stats

    model = apply_variant(name, build_model(args, device))
    stats = get_offload_stats(model)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    step = make_step(model, ids)
    try:
        for _ in range(args.warmup):
            step()
        memory = measure_step_memory(step, device=device)
        times = common.timed_steps(step, args.steps, device)
    except torch.cuda.OutOfMemoryError:
        return {"variant": name, "oom": True}
    finally:
        del model, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    step_s = statistics.median(times)
    result = {
        "variant": name,
        "oom": False,
        "step_s": step_s,
        "tokens_per_s": args.batch_size * args.seq_len / step_s,
        "saved_activation_bytes": memory.saved_activation_bytes,
        "peak_allocated_bytes": memory.peak_allocated_bytes,
        "peak_above_start_bytes": memory.peak_above_start_bytes,
    }
    if stats is not None:
        result["max_resident_blocks"] = stats.max_resident_blocks
        result["bytes_copied_to_host"] = stats.bytes_copied
    return result


# (meshtrain variant, hand-written torch variant it is compared with)
COMPARISONS = [
    ("meshtrain_ac", "torch_ac"),
    ("meshtrain_offload_native", "torch_ac_offload"),
    ("meshtrain_offload_h2", "torch_ac_offload"),
    ("meshtrain_offload_h2", "torch_ac"),
]


def ratios(results: dict[str, dict]) -> list[dict]:
    out = []
    for ours, theirs in COMPARISONS:
        a, b = results.get(ours), results.get(theirs)
        if not a or not b or a["oom"] or b["oom"]:
            continue
        row = {"meshtrain": ours, "torch": theirs, "step_time_ratio": a["step_s"] / b["step_s"]}
        if a["peak_allocated_bytes"] is not None:
            row["peak_memory_ratio"] = a["peak_allocated_bytes"] / b["peak_allocated_bytes"]
        out.append(row)
    return out


def print_report(results: dict[str, dict], rows: list[dict], device: str) -> None:
    print(f"device: {device}")
    print(f"{'variant':28} {'step ms':>9} {'tokens/s':>10} {'peak GiB':>9} {'saved GiB':>10}")
    for name, r in results.items():
        if r["oom"]:
            print(f"{name:28} {'out of memory':>40}")
            continue
        peak = r["peak_allocated_bytes"]
        peak_text = f"{peak / common.GIB:9.2f}" if peak is not None else f"{'-':>9}"
        print(f"{name:28} {r['step_s'] * 1e3:9.1f} {r['tokens_per_s']:10.0f} {peak_text} "
              f"{r['saved_activation_bytes'] / common.GIB:10.3f}")
    for row in rows:
        memory = row.get("peak_memory_ratio")
        memory_text = f", peak memory x{memory:.3f}" if memory is not None else ""
        print(f"{row['meshtrain']} / {row['torch']}: step time x{row['step_time_ratio']:.3f}"
              f"{memory_text}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.require_gpu_unless_smoke("gpu_activation_offload.py", args.smoke):
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = ["torch_none", "torch_ac", "meshtrain_ac", "torch_ac_offload",
                "meshtrain_offload_native", *(f"meshtrain_offload_h{h}" for h in args.horizons)]
    results = {name: run_variant(name, args, device) for name in variants}
    rows = ratios(results)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print_report(results, rows, name)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": name, "args": vars(args), "results": results,
                       "ratios": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
