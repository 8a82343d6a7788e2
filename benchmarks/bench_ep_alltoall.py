"""Benchmark: all-to-all bytes per training step of expert parallelism vs the theoretical volume.

A stack of meshtrain `MoE` layers (residual, float32) is split with `apply_expert_parallel` over
``--ranks`` ranks (``--ep`` experts groups, the rest FSDP-free data parallelism) and runs
forward + backward on random tokens. Every token-carrying all-to-all is counted where it enters
torch's functional collective (a TorchDispatchMode on ``_c10d_functional.all_to_all_single``):
the rows a rank sends to OTHER ranks, times the row size.

The theoretical volume is computed separately from the router's choices (captured before
dispatch): per layer and step a rank sends its assignments to remote experts (dispatch), the
outputs for the assignments it received from remote ranks (combine), and the same two again in
backward (gradients retrace both). Uniform routing would make that
``4 * tokens * top_k * (ep - 1) / ep * hidden * bytes`` per rank and layer; that expectation is
printed too. Byte counts do not depend on the machine; this runs on CPU (gloo) or CUDA (NCCL).

``--tp`` (TP x EP, the EP group folded over shard x tp): the ranks of a tp group hold the same
tokens and each dispatches only its share of them (`apply_expert_parallel(..., tp_mesh=)`); the
theory then counts each rank's share, and the uniform expectation ``tokens / tp``.

    python benchmarks/bench_ep_alltoall.py --ranks 4 --ep 4 --tokens 1024 --hidden 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, help="ranks (self-launch via torchrun)")
    parser.add_argument("--ep", type=int, default=4, help="expert_parallel_degree")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor_parallel_degree: tp ranks share tokens, split before dispatch")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per rank per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    return parser.parse_args(argv)


class AllToAllBytes(TorchDispatchMode):
    """Counts what each all_to_all_single sends to other ranks (payload and metadata apart)."""

    def __init__(self, my_group_rank: int) -> None:
        super().__init__()
        self.my_group_rank = my_group_rank
        self.payload_bytes = 0
        self.metadata_bytes = 0
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops._c10d_functional.all_to_all_single.default:
            tensor, _, input_splits = args[0], args[1], args[2]
            row_bytes = tensor[0].numel() * tensor.element_size() if tensor.dim() > 1 else (
                tensor.element_size())
            sent = tensor.shape[0] - int(input_splits[self.my_group_rank])
            if tensor.is_floating_point():
                self.payload_bytes += sent * row_bytes
                self.calls += 1
            else:
                self.metadata_bytes += sent * row_bytes
        return func(*args, **(kwargs or {}))


class MoEStack(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        from meshtrain_runtime.modules.moe import MoE, MoEConfig

        config = MoEConfig(random_seed=0)
        self.layers = nn.ModuleList(
            MoE(args.hidden, args.intermediate, args.experts, args.top_k, config=config,
                layer_id=i)
            for i in range(args.layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return x


def remote_rows(model: nn.Module, routes: list[torch.Tensor], ep: int, ep_group) -> int:
    """Rows this rank must send per step in theory: 2 x (dispatched out + received in)."""
    from meshtrain_runtime.parallel.expert import expert_parallel_modules

    me = dist.get_rank(ep_group)
    total = 0
    for module, index in zip(expert_parallel_modules(model), routes, strict=True):
        dest = torch.div(index.reshape(-1), module.num_local_experts, rounding_mode="floor")
        per_dest = torch.bincount(dest, minlength=ep)
        incoming = torch.empty_like(per_dest)
        dist.all_to_all_single(incoming, per_dest, group=ep_group)  # what each rank sends me
        out_remote = int(per_dest.sum() - per_dest[me])
        in_remote = int(incoming.sum() - incoming[me])
        total += 2 * (out_remote + in_remote)  # forward dispatch+combine, backward the same
    return total


def _dispatched(module: nn.Module, top_k_index: torch.Tensor) -> torch.Tensor:
    """The routes this rank dispatches: with TP x EP only its tp share of the rows."""
    if module.token_split is None:
        return top_k_index.detach()
    start, stop = module.token_split.bounds(top_k_index.shape[0])
    return top_k_index[start:stop].detach()


def run(args: argparse.Namespace) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from meshtrain_runtime.parallel.expert import apply_expert_parallel, expert_parallel_modules

    world = dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if (
        torch.cuda.is_available()) else torch.device("cpu")
    mesh = init_device_mesh(device.type, (1, world // args.ep, args.ep),
                            mesh_dim_names=("replicate", "shard_mod_ep", "ep"))
    tp_mesh = init_device_mesh(device.type, (world // args.tp, args.tp),
                               mesh_dim_names=("dp", "tp"))["tp"] if args.tp > 1 else None
    model = apply_expert_parallel(MoEStack(args).to(device), mesh, tp_mesh=tp_mesh)
    routes: list[torch.Tensor] = []
    for module in expert_parallel_modules(model):
        module.register_forward_pre_hook(lambda m, a: routes.append(_dispatched(m, a[1])))
    counter = AllToAllBytes(mesh["ep"].get_local_rank())
    theory_rows = 0
    torch.manual_seed(1 + dist.get_rank() // args.tp)  # a tp group shares its tokens
    for _ in range(args.steps):
        routes.clear()
        # requires_grad: as behind an embedding or attention, so layer 0's dispatch has a
        # backward all-to-all too.
        x = torch.randn(args.tokens, args.hidden, device=device, requires_grad=True)
        with counter:
            model(x).square().mean().backward()
        theory_rows += remote_rows(model, routes, args.ep, mesh["ep"].get_group())
    row_bytes = args.hidden * 4
    uniform = (4 * args.tokens / args.tp * args.top_k * (args.ep - 1) / args.ep * row_bytes
               * args.layers)
    return {
        "rank": dist.get_rank(),
        "measured_bytes_per_step": counter.payload_bytes / args.steps,
        "theoretical_bytes_per_step": theory_rows * row_bytes / args.steps,
        "uniform_routing_bytes_per_step": uniform,
        "metadata_bytes_per_step": counter.metadata_bytes / args.steps,
        "token_all_to_alls_per_step": counter.calls / args.steps,
    }


def report(rows: list[dict], args: argparse.Namespace) -> dict:
    measured = sum(r["measured_bytes_per_step"] for r in rows)
    theory = sum(r["theoretical_bytes_per_step"] for r in rows)
    uniform = sum(r["uniform_routing_bytes_per_step"] for r in rows)
    summary = {
        "config": vars(args),
        "per_rank": rows,
        "measured_bytes_per_step": measured,
        "theoretical_bytes_per_step": theory,
        "measured_over_theoretical": measured / theory if theory else None,
        "uniform_routing_bytes_per_step": uniform,
        "measured_over_uniform": measured / uniform if uniform else None,
    }
    print(f"EP all-to-all, {args.ranks} ranks, tp={args.tp}, ep={args.ep}, {args.experts} "
          f"experts top-{args.top_k}, {args.layers} layers, {args.tokens} tokens/rank, "
          f"hidden {args.hidden}")
    print(f"{'rank':>4} {'measured B/step':>16} {'theory B/step':>14} {'ratio':>6} "
          f"{'a2a/step':>8} {'meta B/step':>11}")
    for r in rows:
        ratio = r["measured_bytes_per_step"] / r["theoretical_bytes_per_step"]
        print(f"{r['rank']:>4} {r['measured_bytes_per_step']:>16,.0f} "
              f"{r['theoretical_bytes_per_step']:>14,.0f} {ratio:>6.3f} "
              f"{r['token_all_to_alls_per_step']:>8.0f} {r['metadata_bytes_per_step']:>11,.0f}")
    print(f"all ranks: measured/theoretical = {summary['measured_over_theoretical']:.4f}, "
          f"measured/uniform-routing expectation = {summary['measured_over_uniform']:.4f}")
    return summary


def main() -> None:
    args = parse_args()
    if "RANK" not in os.environ:  # re-launch under torchrun, one process per rank
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.ranks}", "-m", "meshtrain_runtime.host.rank_entry",
                   os.path.abspath(__file__), *sys.argv[1:]]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        sys.exit(subprocess.run(command, env=env, timeout=1800).returncode)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    if dist.get_world_size() % args.ep or dist.get_world_size() % args.tp:
        raise SystemExit(f"--ep {args.ep} and --tp {args.tp} must divide the world size "
                         f"{dist.get_world_size()}")
    rows: list = [None] * dist.get_world_size()
    dist.all_gather_object(rows, run(args))
    if dist.get_rank() == 0:
        summary = report(rows, args)
        if args.json:
            with open(args.json, "w") as stream:
                json.dump(summary, stream, indent=2)


if __name__ == "__main__":
    main()
