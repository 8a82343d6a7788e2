"""Step time of `meshtrain_runtime.transform` vs the same FSDP2 layout written by hand.

One command (it starts torchrun itself):

    python benchmarks/bench_fsdp.py                      # 2 ranks, full sharding
    python benchmarks/bench_fsdp.py --ranks 4 --hybrid-shard-degree 2

A = a tiny-but-not-trivial HF Llama after ``transform()``; B = the same model, same seed, with
``fully_shard`` applied by hand in the same layout (embedding, each decoder layer, the output
head without reshard-after-forward, then the root) on a mesh built by hand. Both train with
AdamW on the same batches. Runs are interleaved (A B B A ...) so machine noise hits both alike;
each round gives a ratio A / B of adjacent median step times; rank 0 prints the median of those
ratios (1.00 = no overhead) with its interquartile range, and the ratio of overall medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes to start")
    parser.add_argument("--hybrid-shard-degree", type=int, default=0, help="0 = all ranks")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved A/B rounds")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round and model")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4, help="rows per rank")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Start this file on `--ranks` processes under meshtrain's rank entry (clean exits)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={args.ranks}", "-m", "meshtrain_runtime.host.rank_entry",
        str(Path(__file__).resolve()), *argv, "--worker",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env, check=False).returncode


def build_model(args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
        vocab_size=2048, max_position_embeddings=args.seq,
    )
    return LlamaForCausalLM(config)


def shard_by_hand(model, hybrid_shard_degree: int):
    """What a user writes with torch alone for the same layout."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    shard = hybrid_shard_degree or world
    if shard == world:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (world // shard, shard), mesh_dim_names=("rep", "shard"))
    fully_shard(model.model.embed_tokens, mesh=mesh, reshard_after_forward=True)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model.lm_head, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh)
    return model


def time_steps(model, optimizer, batches, steps: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for step in range(steps):
        tokens = batches[step % len(batches)]
        dist.barrier()
        start = time.perf_counter()
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return times


def run_worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import meshtrain_runtime

    meshtrain_runtime.init({"hybrid_shard_degree": args.hybrid_shard_degree})
    models = {
        "transform": meshtrain_runtime.transform(build_model(args)),
        "by_hand": shard_by_hand(build_model(args), args.hybrid_shard_degree),
    }
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    generator = torch.Generator().manual_seed(dist.get_rank())
    batches = [torch.randint(0, 2048, (args.batch, args.seq), generator=generator)
               for _ in range(4)]
    for name, model in models.items():
        time_steps(model, optimizers[name], batches, args.warmup)
    samples: dict[str, list[float]] = {name: [] for name in models}
    round_ratios = []
    for round_index in range(args.rounds):
        order = list(models) if round_index % 2 == 0 else list(reversed(models))
        medians = {}
        for name in order:
            times = time_steps(models[name], optimizers[name], batches, args.steps)
            samples[name].extend(times)
            medians[name] = statistics.median(times)
        round_ratios.append(medians["transform"] / medians["by_hand"])
    if dist.get_rank() == 0:
        print_result(args, samples, round_ratios, dist.get_world_size())


def print_result(args, samples, round_ratios, world: int) -> None:
    a, b = (statistics.median(samples[k]) for k in ("transform", "by_hand"))
    q1, median, q3 = statistics.quantiles(round_ratios, n=4)
    from meshtrain_runtime import state

    layout = (
        f"{state.sharding_strategy} (shard {state.hybrid_shard_degree} x replicate "
        f"{state.replicate_degree})"
    )
    result = {
        "median_round_ratio": round(median, 4),
        "round_ratio_iqr": [round(q1, 4), round(q3, 4)],
        "ratio_of_medians": round(a / b, 4),
        "transform_ms": round(1e3 * a, 2),
        "by_hand_ms": round(1e3 * b, 2),
        "ranks": world,
        "layout": layout,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
    }
    print(
        f"transform / hand-written fully_shard step time: median ratio {median:.4f} "
        f"(interquartile {q1:.4f}..{q3:.4f}; ratio of medians {a / b:.4f}: "
        f"{result['transform_ms']} ms vs {result['by_hand_ms']} ms; {world} ranks, {layout}, "
        f"{args.rounds} interleaved rounds x {args.steps} steps)"
    )
    print("RESULT " + json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not args.worker:
        return launch(args, argv)
    run_worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
