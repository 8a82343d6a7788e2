"""transform() vs the same layout written by hand with torch, for every parallel layout.

Run on N ranks by ``benchmarks/run_all.py`` (or by hand under torchrun through meshtrain's rank
entry). For each layout named on the command line, rank 0 prints one ``RESULT {json}`` line:

- ``round_ratios``: interleaved rounds (A B, then B A, ...) of ``--steps`` steps each; a round's
  ratio is median step time of transform() over median step time of the hand-written model;
- ``cpu_round_ratios``: the same rounds' CPU seconds (every thread of every rank, summed over
  the ranks) of transform() over the hand-written model's. With more ranks than cores a step's
  wall time is the ranks' CPU work shared out by the scheduler; this is the work itself;
- ``memory``: per-rank local parameter bytes of both models and the theory
  ``total / (shard degree x tp degree)`` (FSDP pads dim 0 to a multiple of the shard degree;
  tensor parallelism leaves norm weights whole, so meshtrain's bytes are at or a little above it);
- ``collectives``: payload bytes per step (torch's CommDebugMode) of both models and, for the
  FSDP-only layouts, the theory: forward all-gather of every parameter, backward all-gather of
  the groups resharded after forward (all but the output head and the root), reduce-scatter of
  every gradient, plus an all-reduce of the gradient shards over replicas when hybrid;
- ``first_loss``: both sides' first-step loss (mean over the ranks) and their largest difference
  on any rank; ``plain_parameters``: parameters that are plain tensors, per side;
  ``own_classes``: module classes from neither torch nor transformers, per side.

Hand-written sides (torch only; benchmarks/RESULTS.md says which baseline each run used):
``fully_shard`` per block, embedding, head (no reshard) and root on an ``init_device_mesh`` mesh;
TP with ``parallelize_module`` and torchtitan's Llama plan (HF names) from
benchmarks/bench_tp_comm.py. With TP alone the parameters the plan leaves whole (the norms) stay
plain tensors, replicated on every rank and computed on as such: what ``transform()`` computes
too (it keeps them as Replicate DTensors for the optimizer and clip_grad_norm_ but runs the
norms on their local tensors), and what a CPU user trains with (AdamW's single-tensor path, the
CPU default, takes a mix of plain tensors and DTensors; CUDA's foreach path does not, a GPU-side
concern). Expert parallelism: benchmarks/ep_by_hand.py, torch's all-to-all with no meshtrain
code, the model's own router. With ``compile`` both sides compile each block in place; under TP
the hand-written side also waits for the embedding's pending all-reduce, as ``transform()`` does
(`_wait_for_embedding`). Both sides start from the same weights and rows, so equal first-step
losses say both do the same work.

``null_<layout>`` measures the method itself: the hand-written model of ``<layout>`` against a
second copy of itself. Its ratio is what "no overhead" reads as on the machine at hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

# layout name -> (SMP parameters, model kind)
LAYOUTS: dict[str, tuple[dict[str, Any], str]] = {
    "full_shard": ({}, "llama"),
    "hybrid": ({"hybrid_shard_degree": 2}, "llama"),
    "tp": ({"tensor_parallel_degree": 0}, "llama"),  # 0: every rank (filled in at run time)
    "tp_x_hybrid": ({"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}, "llama"),
    "ep": ({"expert_parallel_degree": 2}, "mixtral"),
    # compile: true on both sides
    "full_shard_compile": ({"compile": True}, "llama"),
    "hybrid_compile": ({"hybrid_shard_degree": 2, "compile": True}, "llama"),
    "tp_compile": ({"tensor_parallel_degree": 0, "compile": True}, "llama"),
    "tp_x_hybrid_compile": ({"tensor_parallel_degree": 2, "hybrid_shard_degree": 2,
                             "compile": True}, "llama"),
    "ep_compile": ({"expert_parallel_degree": 2, "compile": True}, "mixtral"),
}
OUTSIDE = {"torch", "transformers", "builtins", "typing"}
NULL_PREFIX = "null_"  # null_<layout>: the hand-written <layout> against a copy of itself
DEFAULT_LAYOUTS = "full_shard,hybrid,tp,tp_x_hybrid,ep"
VOCAB = 512


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    return parser.parse_args(argv)


def build_model(kind: str, args: argparse.Namespace) -> nn.Module:
    """A small HF model from a config (never downloaded), the same on every rank."""
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    common = dict(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                  num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                  vocab_size=VOCAB, max_position_embeddings=args.seq)
    torch.manual_seed(0)
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**common, num_local_experts=4,
                                                num_experts_per_tok=2))
    return LlamaForCausalLM(LlamaConfig(**common))


def hand_mesh(params: dict[str, Any]) -> tuple[DeviceMesh, int, int, int]:
    """(mesh, replicate, shard, tp) built with init_device_mesh, as a user would."""
    world = dist.get_world_size()
    tp = params.get("tensor_parallel_degree", 1)
    dp = world // tp
    shard = params.get("hybrid_shard_degree") or dp
    names = ("replicate", "shard", "tp")
    mesh = init_device_mesh("cpu", (dp // shard, shard, tp), mesh_dim_names=names)
    return mesh, dp // shard, shard, tp


def shard_by_hand(model: nn.Module, mesh: DeviceMesh, replicate: int) -> nn.Module:
    """torchtitan's FSDP2 layout written out."""
    dp_mesh = mesh["shard"] if replicate == 1 else mesh["replicate", "shard"]
    fully_shard(model.model.embed_tokens, mesh=dp_mesh, reshard_after_forward=True)
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh, reshard_after_forward=True)
    fully_shard(model.lm_head, mesh=dp_mesh, reshard_after_forward=False)
    fully_shard(model, mesh=dp_mesh)
    return model


def build_by_hand(name: str, params: dict[str, Any], args: argparse.Namespace) -> nn.Module:
    from bench_tp_comm import torch_plan
    from ep_by_hand import expert_mesh, expert_parallel_by_hand
    from torch.distributed.tensor.parallel import parallelize_module

    model = build_model(spec(name)[1], args)
    mesh, replicate, shard, tp = hand_mesh(params)
    ep = params.get("expert_parallel_degree", 1)
    if ep > 1:
        return expert_parallel_by_hand(
            model, expert_mesh(replicate, shard, ep), compile_blocks=params.get("compile", False),
            fsdp_rest=lambda m: shard_by_hand(m, mesh, replicate))
    if tp > 1:  # the norms stay plain tensors (module docstring)
        parallelize_module(model, mesh["tp"], torch_plan(model, sp=False, lp=False))
    if params.get("compile"):  # torchtitan: per block, after TP, before FSDP
        for layer in model.model.layers:
            layer.compile()
        if tp > 1:
            model.model.embed_tokens.register_forward_hook(_wait_for_embedding)
    if replicate * shard > 1:
        shard_by_hand(model, mesh, replicate)
    return model


def _wait_for_embedding(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """What a hand-written TP + compile model needs (torch 2.13): the vocab-parallel embedding
    returns its all-reduce still pending (an AsyncCollectiveTensor), and a compiled block given
    one breaks the embedding's backward; clone() waits for it and keeps the autograd edge."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def spec(name: str) -> tuple[dict[str, Any], str, bool]:
    """(SMP parameters, model kind, null?) of a layout name."""
    null = name.startswith(NULL_PREFIX)
    base = name[len(NULL_PREFIX):] if null else name
    if base not in LAYOUTS:
        known = ", ".join([*LAYOUTS, *(NULL_PREFIX + n for n in LAYOUTS)])
        raise SystemExit(f"unknown layout {name!r}; known: {known}")
    return LAYOUTS[base][0], LAYOUTS[base][1], null


class Step:
    """One training step of `model`; keeps the loss of its first call."""

    def __init__(self, model: nn.Module, ids: torch.Tensor) -> None:
        self.model, self.ids = model, ids
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.first_loss: float | None = None

    def __call__(self) -> None:
        loss = self.model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.first_loss is None:
            self.first_loss = float(loss.detach())


def first_losses(steps: dict[str, Step]) -> dict[str, float]:
    """Both sides' first-step loss averaged over the ranks, and the largest difference of the
    two on any rank (same weights, same rows: the same work gives the same loss)."""
    local = torch.tensor([steps["transform"].first_loss, steps["by_hand"].first_loss],
                         dtype=torch.float64)
    mean, diff = local.clone(), (local[0] - local[1]).abs().reshape(1)
    dist.all_reduce(mean)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    mean /= dist.get_world_size()
    return {"transform": float(mean[0]), "by_hand": float(mean[1]),
            "max_abs_diff": float(diff[0])}


def own_classes(model: nn.Module) -> list[str]:
    """Module classes in `model` (and their bases: fully_shard subclasses them) that come from
    neither torch nor transformers: meshtrain's on the transform() side, the benchmark's own
    (``ep_by_hand.AllToAllExperts``) and no meshtrain class on a hand-written side."""
    found = {f"{c.__module__}.{c.__qualname__}" for m in model.modules()
             for c in type(m).__mro__ if c.__module__.split(".")[0] not in OUTSIDE}
    return sorted(found)


def timed(step, count: int) -> tuple[list[float], float]:
    """Wall seconds of each of `count` steps, and the CPU seconds of all of them summed over
    the ranks (this process's every thread: gloo's included)."""
    times, cpu = [], 0.0
    for _ in range(count):
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        cpu += time.process_time() - cpu_start
        dist.barrier()
        times.append(time.perf_counter() - start)
    total = torch.tensor([cpu], dtype=torch.float64)
    dist.all_reduce(total)  # outside the timed steps
    return times, float(total)


def local_bytes(model: nn.Module) -> int:
    total = 0
    for p in model.parameters():
        t = p.to_local() if isinstance(p, DTensor) else p
        total += t.numel() * t.element_size()
    return total


def plain_parameters(model: nn.Module) -> int:
    """How many parameters are plain tensors (0: both sides train DTensors only, so torch's
    foreach optimizers accept them)."""
    return sum(not isinstance(p, DTensor) for p in model.parameters())


def fsdp_theory(model: nn.Module, replicate: int, shard: int) -> dict[str, int]:
    """Payload bytes per step of torchtitan's FSDP2 layout (whole logical tensors)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    kept = sum(p.numel() * p.element_size() for p in model.lm_head.parameters())
    kept += sum(p.numel() * p.element_size() for p in model.model.norm.parameters())
    theory = {"forward/all_gather": total, "backward/all_gather": total - kept,
              "backward/reduce_scatter": total}
    if replicate > 1:
        theory["backward/all_reduce"] = total // shard
    return theory


def collectives(step) -> dict[str, int]:
    from meshtrain_runtime.diagnostics.collectives import count_collectives

    stats = count_collectives(step)
    return {f"{phase}/{op}": n for (phase, op), n in sorted(stats.payload_bytes.items())}


def run_layout(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import meshtrain_runtime as mr

    params, kind, null = spec(name)
    if params.get("tensor_parallel_degree") == 0:
        params = {**params, "tensor_parallel_degree": int(os.environ["WORLD_SIZE"])}
    mr.reset()
    mr.init(params)
    reference = build_model(kind, args)
    theory_bytes_total = sum(p.numel() * p.element_size() for p in reference.parameters())
    # "transform" is the side under test; a null layout puts a second hand-written copy there
    subject = build_by_hand(name, params, args) if null else mr.transform(build_model(kind, args))
    models = {"transform": subject, "by_hand": build_by_hand(name, params, args)}
    _, replicate, shard, tp = hand_mesh(params)
    ids = torch.randint(0, VOCAB, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(mr.state.dp_rank))
    steps = {k: Step(m, ids) for k, m in models.items()}
    # CommDebugMode's module tracker fails on HF Mixtral's MoE blocks; EP's all-to-all bytes
    # are measured against theory by bench_ep_alltoall.py (its own dispatch-level counter).
    comm = {k: collectives(s) for k, s in steps.items()} if kind == "llama" else {}
    for step in steps.values():
        timed(step, args.warmup)
    ratios, cpu_ratios, samples = [], [], {k: [] for k in steps}
    for index in range(args.rounds):
        medians, cpu = {}, {}
        for key in (list(steps) if index % 2 == 0 else list(reversed(steps))):
            times, cpu[key] = timed(steps[key], args.steps)
            samples[key].extend(times)
            medians[key] = statistics.median(times)
        ratios.append(medians["transform"] / medians["by_hand"])
        cpu_ratios.append(cpu["transform"] / cpu["by_hand"])
    memory = {"transform_bytes": local_bytes(models["transform"]),
              "by_hand_bytes": local_bytes(models["by_hand"]),
              "theory_bytes": theory_bytes_total // (shard * tp)}
    comm["theory"] = fsdp_theory(reference, replicate, shard) if tp == 1 and kind == "llama" \
        else None
    return {"layout": name, "null": null, "parameters": params,
            "ranks": dist.get_world_size(),
            "mesh": {"replicate": replicate, "shard": shard, "tp": tp},
            "round_ratios": ratios, "cpu_round_ratios": cpu_ratios,
            "step_ms": {k: 1e3 * statistics.median(v) for k, v in samples.items()},
            "memory": memory, "collective_bytes": comm,
            "plain_parameters": {k: plain_parameters(m) for k, m in models.items()},
            "first_loss": first_losses(steps),
            "own_classes": {k: own_classes(m) for k, m in models.items()}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for name in args.layouts.split(","):
        spec(name)  # unknown names fail here
        result = run_layout(name, args)
        if dist.get_rank() == 0:
            print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
