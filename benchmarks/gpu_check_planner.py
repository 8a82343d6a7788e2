"""gpu-check section "planner": meshtrain's plan against the device, phase by phase.

For each layout (built by init() / transform() on a world of one, as a training script builds
it) one training step of a Llama is measured with the runtime's PhaseMemoryMeter (on CUDA:
``torch.cuda.max_memory_allocated`` reset at each phase's end) and printed beside the plan's
figure for the same phase (``meshtrain.plan.phases.phase_memory``). Both count bytes above what
the step starts with (the sharded parameters and optimizer states, which the plan adds as its
resident terms; the plan's figure here leaves them out). The goal on a GPU: every phase within
5 % of the plan. A miss is reported, never a failed check: it says the plan needs work.

Phase ends (as tests/runtime/workers/calib_support.py): the head's forward pre-hook (forward),
the gradient reaching the head's output (loss), the end of backward, the end of the optimizer
step (the second step: AdamW's states exist; gradients were set to None before it).

The plan side (`planned_phases`, `GPU_LAYOUTS`) needs no torch: tests/sdk/test_plan_h200.py
replays the committed H200 table through it. Each layout's row records its parameters, the
model's shape and the lengths, so a committed table can be replayed as it was measured.

    python benchmarks/gpu_check_planner.py --json planner.json        # on a CUDA GPU
    python benchmarks/gpu_check_planner.py --smoke --json p.json      # tiny, on CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/ is not a package

GOAL = 0.05
GPU_LAYOUTS = {
    "fsdp_bf16": {"mixed_precision": "bf16"},
    "ac_bf16": {"mixed_precision": "bf16", "activation_checkpointing": True},
    "ac_offload_bf16": {"mixed_precision": "bf16", "activation_checkpointing": True,
                        "activation_offloading": True},
    "ac_cpu_offload_bf16": {"mixed_precision": "bf16", "activation_checkpointing": True,
                            "cpu_offload": True},
    "sac_bf16": {"mixed_precision": "bf16", "activation_checkpointing": "selective"},
    "sac_offload_bf16": {"mixed_precision": "bf16", "activation_checkpointing": "selective",
                         "activation_offloading": True},
}
CPU_LAYOUTS = {"fsdp": {}, "ac": {"activation_checkpointing": True},
               "ac_offload": {"activation_checkpointing": True, "activation_offloading": True},
               "sac": {"activation_checkpointing": "selective"}}
SHAPE_KEYS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab", "seq_len",
              "batch_size")


def hf_config(shape: dict[str, int]) -> dict[str, Any]:
    """The HF LlamaConfig fields of gpu_common.build_llama for a shape (SHAPE_KEYS)."""
    return {"model_type": "llama", "hidden_size": shape["hidden"],
            "intermediate_size": shape["intermediate"], "num_hidden_layers": shape["layers"],
            "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
            "vocab_size": shape["vocab"], "tie_word_embeddings": False,
            "_attn_implementation": "sdpa"}


def planned_phases(shape: dict[str, int], params: dict[str, Any], *,
                   on_gpu: bool) -> dict[str, float]:
    """The plan's bytes per phase above the resident states (the sharded parameters and
    optimizer states the meter's baseline holds), for this layout on a world of one."""
    from meshtrain.contract import SMPParameters, resolve_degrees
    from meshtrain.plan import Training, activation_bytes, resolve_model
    from meshtrain.plan.activations import RECOMPUTE_FOR_POLICY
    from meshtrain.plan.phases import phase_memory

    spec = resolve_model(hf_config(shape))
    smp = SMPParameters(**params)
    precision = params.get("mixed_precision", "fp32")
    seq_len, batch = shape["seq_len"], shape["batch_size"]
    acts = activation_bytes(spec, seq_len=seq_len, micro_batch=batch, precision=precision,
                            recompute=RECOMPUTE_FOR_POLICY[smp.checkpointing_policy],
                            offload=smp.activation_offloading)
    phases = phase_memory(spec, resolve_degrees(smp, 1),
                          Training(seq_len=seq_len, micro_batch=batch, precision=precision),
                          acts, offload="cpu_offload" if smp.cpu_offload else "none",
                          on_gpu=on_gpu)
    return {p.name: p.total - p.terms.get("sharded_parameters", 0)
            - p.terms.get("optimizer_states", 0) for p in phases}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import gpu_common as common

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_arguments(parser, seq_len=2048, batch_size=2, warmup=1, steps=1)
    parser.set_defaults(layers=4)  # TinyLlama's widths, 4 blocks: a step in well under a second
    args = parser.parse_args(argv)
    common.shrink_for_smoke(args, layers=2, seq_len=32, warmup=1, steps=1)
    return args


def measure(model: Any, optimizer: Any, ids: Any, device: Any) -> dict[str, int]:
    """Peak bytes above the step's start in each phase of one training step."""
    from meshtrain_runtime.diagnostics.memory import PhaseMemoryMeter

    head = model.get_output_embeddings()
    meter = PhaseMemoryMeter(device if device.type == "cuda" else None)

    def head_output(module: Any, args: Any, output: Any) -> None:
        output.register_hook(lambda grad: meter.mark("loss"))

    hooks = [head.register_forward_pre_hook(lambda module, args: meter.mark("forward")),
             head.register_forward_hook(head_output)]
    with meter:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        meter.mark("backward")
        del loss
        optimizer.step()
        meter.mark("optimizer_step")
    for hook in hooks:
        hook.remove()
    optimizer.zero_grad(set_to_none=True)
    return meter.peaks


def run_layout(name: str, params: dict[str, Any], args: argparse.Namespace,
               device: Any) -> list[dict[str, Any]]:
    """One row per phase: measured and planned bytes, their ratio, whether within the goal."""
    import gpu_common as common
    import torch

    import meshtrain_runtime as mr

    mr.reset()
    mr.init(params)
    model = mr.transform(common.build_llama(args, device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    for _ in range(max(1, args.warmup)):  # AdamW's states exist from the first step on
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    measured = measure(model, optimizer, ids, device)
    shape = {key: getattr(args, key) for key in SHAPE_KEYS}
    planned = planned_phases(shape, params, on_gpu=device.type == "cuda")
    del model, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    rows = []
    for phase, bytes_planned in planned.items():
        bytes_measured = measured.get(phase)
        ratio = bytes_measured / bytes_planned if bytes_measured and bytes_planned else None
        rows.append({"layout": name, "phase": phase, "measured_bytes": bytes_measured,
                     "planned_bytes": int(bytes_planned), "ratio": ratio,
                     "within_goal": ratio is not None and abs(ratio - 1) <= GOAL,
                     "params": params, "shape": shape})
    return rows


def main(argv: list[str] | None = None) -> int:
    import gpu_common as common
    import torch

    args = parse_args(argv)
    if not common.require_gpu_unless_smoke("gpu_check_planner.py", args.smoke):
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    layouts = GPU_LAYOUTS if device.type == "cuda" else CPU_LAYOUTS
    rows: list[dict[str, Any]] = []
    for name, params in layouts.items():
        rows.extend(run_layout(name, params, args, device))
        if args.json:  # after each layout: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"device": device.type, "goal": GOAL,
                                                   "rows": rows}, indent=1))
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['layout']:22} {row['phase']:15} measured {row['measured_bytes']} "
              f"planned {row['planned_bytes']} ratio {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
