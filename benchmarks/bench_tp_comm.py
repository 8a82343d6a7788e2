"""Tensor-parallel communication per training step: meshtrain vs hand-written torch vs Megatron.

For a Llama-style model (HF LlamaForCausalLM from a small config, float32) and each layout
(sequence parallel on/off, loss parallel on/off) this counts the collectives of one forward +
backward and of one AdamW step with torch's CommDebugMode (``count_collectives``), for:

  meshtrain     apply_tensor_parallel(model, tp_mesh, sequence_parallel=..., loss_parallel=...)
  torch         the same layout written by hand with parallelize_module (torchtitan's Llama
                plan adapted to HF module names: PrepareModuleInput on attention and MLP)
  expected      Megatron-LM's figures: per layer 2 all-reduces forward + 2 backward of one
                [batch, seq, hidden] activation without SP; 2 all-gathers + 2 reduce-scatters
                each way with SP; plus the vocab-parallel embedding and LM head

and prints counts, payload bytes (whole logical tensors) and ring bytes sent per rank, the
ratio meshtrain / expected, and the median step time ratio meshtrain / torch (same run).

    python benchmarks/bench_tp_comm.py --tp 2            # relaunches itself under torchrun
    python benchmarks/bench_tp_comm.py --tp 4 --layers 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from meshtrain_runtime.diagnostics.collectives import count_collectives
from meshtrain_runtime.parallel.tensor import apply_tensor_parallel

LAYOUTS = [(False, False), (False, True), (True, False), (True, True)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2, help="tensor_parallel_degree (ranks)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=688)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per variant")
    parser.add_argument("--json", help="also write the results to this file (rank 0)")
    parser.add_argument("--timeout", type=int, default=900)
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=args.seq_len,
    )
    return LlamaForCausalLM(config).to(device)


def torch_plan(model: nn.Module, sp: bool, lp: bool) -> dict:
    """The layout written by hand (torchtitan's Llama plan, HF names)."""
    stream = Shard(1) if sp else Replicate()
    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=stream,
                                              use_local_output=not sp),
        "lm_head": ColwiseParallel(input_layouts=stream,
                                   output_layouts=Shard(-1) if lp else Replicate(),
                                   use_local_output=not lp),
    }
    if sp:
        plan["model.norm"] = SequenceParallel()
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}"
        plan[f"{layer}.self_attn"] = PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": stream},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
        )
        plan[f"{layer}.mlp"] = PrepareModuleInput(input_layouts=(stream,),
                                                  desired_input_layouts=(Replicate(),))
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "mlp.gate_proj", "mlp.up_proj"):
            plan[f"{layer}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{layer}.{name}"] = RowwiseParallel(output_layouts=stream,
                                                      use_local_output=not sp)
        if sp:
            plan[f"{layer}.input_layernorm"] = SequenceParallel()
            plan[f"{layer}.post_attention_layernorm"] = SequenceParallel()
    return plan


def expected_collectives(args: argparse.Namespace, sp: bool, lp: bool) -> dict[str, list[int]]:
    """Megatron's per-layer figures plus embedding, head, loss-parallel and SP norm grads."""
    act = args.batch_size * args.seq_len * args.hidden * 4
    edges = 2 * args.layers + 1
    if sp:
        out = {key: [edges, edges * act] for key in (
            "forward/reduce_scatter", "forward/all_gather",
            "backward/all_gather", "backward/reduce_scatter")}
        out["backward/all_reduce"] = [edges, edges * args.hidden * 4]  # norm weight grads
    else:
        out = {"forward/all_reduce": [edges, edges * act],
               "backward/all_reduce": [edges, edges * act]}
    if lp:  # max, sum of exp and target logit per token
        tokens = args.batch_size * (args.seq_len - 1)
        count, size = out.get("forward/all_reduce", [0, 0])
        out["forward/all_reduce"] = [count + 3, size + 3 * tokens * 4]
    else:  # the logits gather
        count, size = out.get("forward/all_gather", [0, 0])
        out["forward/all_gather"] = [count + 1,
                                     size + args.batch_size * args.seq_len * args.vocab * 4]
    return out


def make_step(model: nn.Module, ids: torch.Tensor, lp: bool) -> Callable[[], None]:
    def step() -> None:
        logits = model(input_ids=ids).logits
        shifted, targets = logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        if lp:
            with loss_parallel():
                F.cross_entropy(shifted, targets).backward()
        else:
            F.cross_entropy(shifted, targets).backward()

    return step


def measure(model: nn.Module, ids: torch.Tensor, lp: bool, steps: int) -> dict:
    # hand-written pure TP leaves norm weights as plain tensors: foreach AdamW would refuse
    foreach = all(isinstance(p, DTensor) for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
    step = make_step(model, ids, lp)
    stats = count_collectives(step)
    optimizer_stats = count_collectives(optimizer.step)
    optimizer.zero_grad()
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    counts = {f"{phase}/{op}": [n, stats.payload_bytes[(phase, op)]]
              for (phase, op), n in sorted(stats.counts.items())}
    opt = sum(optimizer_stats.counts.values())
    return {"collectives": counts, "optimizer_collectives": opt,
            "median_step_s": statistics.median(times)}


def ring_bytes(collectives: dict[str, list[int]], tp: int) -> int:
    """Bytes each rank sends with ring algorithms: all-reduce 2(t-1)/t, AG/RS (t-1)/t."""
    total = 0.0
    for key, (_, payload) in collectives.items():
        factor = 2 if key.endswith("all_reduce") else 1
        total += factor * (tp - 1) / tp * payload
    return int(total)


def run_layout(args: argparse.Namespace, mesh: DeviceMesh, device: torch.device,
               sp: bool, lp: bool) -> dict:
    ids = torch.randint(0, args.vocab, (args.batch_size, args.seq_len),
                        generator=torch.Generator().manual_seed(1)).to(device)
    ours = apply_tensor_parallel(build_model(args, device), mesh, sequence_parallel=sp,
                                 loss_parallel=lp)
    theirs = build_model(args, device)
    parallelize_module(theirs, mesh, torch_plan(theirs, sp, lp))
    result = {"meshtrain": measure(ours, ids, lp, args.steps),
              "torch": measure(theirs, ids, lp, args.steps),
              "expected": {"collectives": expected_collectives(args, sp, lp)}}
    for entry in result.values():
        entry["ring_bytes_per_rank"] = ring_bytes(entry["collectives"], args.tp)
    return result


def print_layout(name: str, result: dict, tp: int) -> None:
    print(f"\n== {name} (tp={tp}) ==")
    keys = sorted({k for entry in result.values() for k in entry["collectives"]})
    print(f"{'collective':24} {'meshtrain':>20} {'torch by hand':>20} {'Megatron':>20} ratio")
    for key in keys:
        cells = [result[who]["collectives"].get(key, [0, 0])
                 for who in ("meshtrain", "torch", "expected")]
        ratio = cells[0][1] / cells[2][1] if cells[2][1] else float("nan")
        text = [f"{n:>4} x {b / 2**20:9.3f} MiB" for n, b in cells]
        print(f"{key:24} {text[0]:>20} {text[1]:>20} {text[2]:>20} {ratio:.3f}")
    ours, theirs = result["meshtrain"], result["torch"]
    print(f"ring bytes sent per rank: meshtrain {ours['ring_bytes_per_rank'] / 2**20:.3f} MiB, "
          f"torch {theirs['ring_bytes_per_rank'] / 2**20:.3f} MiB, Megatron "
          f"{result['expected']['ring_bytes_per_rank'] / 2**20:.3f} MiB")
    print(f"collectives in the AdamW step: meshtrain {ours['optimizer_collectives']}, "
          f"torch {theirs['optimizer_collectives']}")
    print(f"median step time: meshtrain {ours['median_step_s'] * 1e3:.1f} ms, torch "
          f"{theirs['median_step_s'] * 1e3:.1f} ms, ratio "
          f"{ours['median_step_s'] / theirs['median_step_s']:.3f}")


def rank_main(args: argparse.Namespace) -> None:
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= args.tp
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    device = torch.device("cuda" if use_cuda else "cpu")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
    results = {}
    for sp, lp in LAYOUTS:
        name = f"sequence_parallel={sp}, loss_parallel={lp}"
        results[name] = run_layout(args, mesh, device, sp, lp)
        if dist.get_rank() == 0:
            print_layout(name, results[name], args.tp)
    if dist.get_rank() == 0 and args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "device": device.type, "results": results},
                      handle, indent=1)


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Start this script on `--tp` local ranks through torchrun and meshtrain's rank entry."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.tp}", "-m", "meshtrain_runtime.host.rank_entry",
               os.path.abspath(__file__), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        return subprocess.run(command, env=env, timeout=args.timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"bench_tp_comm: timed out after {args.timeout} s", file=sys.stderr)
        return 124


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if "RANK" not in os.environ:
        return launch(args, argv)
    rank_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
