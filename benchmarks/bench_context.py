"""Context parallelism: attention bytes per cp_comm_type vs the planner, and meshtrain's cp
attention vs hand-written torch.

One command (it starts torchrun itself on --cp ranks through meshtrain's rank entry):

    python benchmarks/bench_context.py --json out.json
    python benchmarks/bench_context.py --smoke --json out.json   # tiny shapes, 2 rounds

Every rank holds its chunks of one causal attention's q (B, H, S / cp, D) and k, v (B, KV,
S / cp, D) in SMP's load-balanced layout (2 cp chunks, rank r keeps chunks r and 2cp-1-r), cut
by hand here from the same seeded full tensors.

1. Bytes. One forward and one backward of ``context_attention`` (meshtrain's public API) per
   cp_comm_type, in fp32 and bf16, with torch.distributed's functions wrapped to count what
   this rank sends: ``batch_isend_irecv``'s isends and ``send`` (the tensor; a bare ``isend``
   cannot be wrapped, since ``P2POp`` accepts only torch's own function, so none may be used),
   ``all_gather`` / ``all_gather_into_tensor`` ((n-1) x the input), ``all_to_all_single`` /
   ``all_to_all`` ((n-1)/n of the input, equal splits), ``reduce_scatter_tensor`` ((n-1)/n of
   the input), ``all_reduce`` (2 (n-1)/n): the ring convention of meshtrain.plan.comm. Theory:
   ``meshtrain.plan.context.context_layer_bytes`` for the same shape (one layer). Equal, per
   phase and per rank, or the planner is wrong.
2. Step time. Forward + backward of the cp attention against the same layout written by hand
   with torch for the all_gather type (torch has no CPU ring attention): one all_gather of the
   packed k and v, put in global order, then per local chunk (its positions are contiguous)
   ``F.scaled_dot_product_attention`` against the prefix of keys it can see, with the causal
   mask over global positions on that prefix (a careful engineer skips the keys after the
   chunk, as meshtrain's blockwise attention does), and in backward (autograd) a
   reduce-scatter of the packed gradients (an all_to_all_single and a sum: gloo has it for
   every dtype). A second hand-written copy is
   the null layout (what "no overhead" reads as). meshtrain's p2p and a2a are timed in the same
   rounds against the same baseline, for the record. Interleaved rounds (sides in order, then
   reversed), wall-clock and CPU-time ratios per round (overhead.timed), quartiles.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMM_TYPES = ("p2p", "all_gather", "a2a")
DTYPES = ("float32", "bfloat16")


# ---- the byte counter (wraps torch.distributed's functions while active) ----

class SentBytes:
    """Bytes this rank sends, by (phase, op), while the context is active."""

    # not isend / irecv: P2POp accepts only torch's own functions (the ring batches them)
    WRAPPED = ("batch_isend_irecv", "send", "all_gather", "all_gather_into_tensor",
               "all_to_all_single", "all_to_all", "reduce_scatter_tensor", "all_reduce")

    def __init__(self) -> None:
        self.phase = "forward"
        self.bytes: dict[str, dict[str, float]] = {}
        self._saved: dict[str, Any] = {}

    def add(self, op: str, count: float) -> None:
        ops = self.bytes.setdefault(self.phase, {})
        ops[op] = ops.get(op, 0.0) + count

    def __enter__(self) -> SentBytes:
        import torch.distributed as dist

        for name in self.WRAPPED:
            original = getattr(dist, name)
            self._saved[name] = original
            setattr(dist, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        for name, original in self._saved.items():
            setattr(dist, name, original)

    def _wrap(self, name: str, original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.add(name, self._sent(name, args, kwargs))
            return original(*args, **kwargs)

        return wrapped

    @staticmethod
    def _sent(name: str, args: tuple, kwargs: dict) -> float:
        import torch.distributed as dist

        group = kwargs.get("group")
        n = dist.get_world_size(group)
        if name == "batch_isend_irecv":
            return sum(_nbytes(op.tensor) for op in args[0]
                       if op.op is dist.distributed_c10d.isend)
        if name == "send":
            return _nbytes(args[0] if args else kwargs["tensor"])
        if name == "all_gather":
            return (n - 1) * _nbytes(args[1] if len(args) > 1 else kwargs["tensor"])
        if name == "all_gather_into_tensor":
            return (n - 1) * _nbytes(args[1] if len(args) > 1 else kwargs["input_tensor"])
        if name == "all_to_all":
            return (n - 1) / n * sum(_nbytes(t) for t in args[1])
        if name in ("all_to_all_single", "reduce_scatter_tensor"):
            return (n - 1) / n * _nbytes(args[1] if len(args) > 1 else kwargs["input"])
        return 2 * (n - 1) / n * _nbytes(args[0] if args else kwargs["tensor"])  # all_reduce


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


# ---- the worker (runs on every rank) ----

def positions(local: int, rank: int, cp: int) -> Any:
    """Global positions of rank `rank`'s tokens: chunks rank and 2cp-1-rank (by hand)."""
    import torch

    chunk = local // 2
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in (rank, 2 * cp - 1 - rank)])


def local_inputs(args: argparse.Namespace, dtype: Any) -> tuple[Any, Any, Any]:
    """This rank's chunks of q, k, v (leaves that require grad), from seeded full tensors."""
    import torch
    import torch.distributed as dist

    rank, cp = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    full = [torch.randn(args.batch, heads, args.seq, args.head_dim, generator=generator)
            for heads in (args.heads, args.kv_heads, args.kv_heads)]
    index = positions(args.seq // cp, rank, cp)
    return tuple(t.index_select(2, index).to(dtype).requires_grad_() for t in full)


def theory(args: argparse.Namespace, comm_type: str, element_bytes: int) -> dict[str, float]:
    """The planner's bytes for this shape: one layer, the rank's b s / cp tokens."""
    import torch.distributed as dist

    from meshtrain.plan.context import context_layer_bytes
    from meshtrain.plan.models import ModelSpec

    cp = dist.get_world_size()
    spec = ModelSpec(name="bench", hidden_size=args.heads * args.head_dim, num_layers=1,
                     num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                     head_dim=args.head_dim, intermediate_size=1, vocab_size=1)
    layer = context_layer_bytes(spec, cp=cp, tokens=args.batch * args.seq // cp,
                                compute_bytes=element_bytes, comm_type=comm_type)
    return {"forward": layer.forward, "backward": layer.backward}


def measure_bytes(args: argparse.Namespace) -> dict[str, Any]:
    """Per cp_comm_type and dtype: what every rank sent in forward and backward, and theory."""
    import torch
    import torch.distributed as dist

    from meshtrain_runtime.parallel.context import context_attention

    result: dict[str, Any] = {}
    for comm_type in COMM_TYPES:
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            q, k, v = local_inputs(args, dtype)
            with SentBytes() as counter:
                out = context_attention(q, k, v, group=dist.group.WORLD, comm_type=comm_type,
                                        is_causal=True)
                counter.phase = "backward"
                out.backward(torch.ones_like(out))
            per_rank: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(per_rank, counter.bytes)
            expected = theory(args, comm_type, torch.empty((), dtype=dtype).element_size())
            measured = [{phase: sum(ops.values()) for phase, ops in r.items()} for r in per_rank]
            result.setdefault(comm_type, {})[dtype_name] = {
                "theory": expected, "measured_per_rank": measured, "by_op": per_rank,
                "equal": all(m.get(p, 0.0) == expected[p] for m in measured for p in expected)}
    return result


def by_hand_attention() -> Any:
    """The hand-written all_gather attention: an autograd function for the gather and SDPA."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    class GatherSeq(torch.autograd.Function):
        """(B, heads, S_local, D) -> (B, heads, cp S_local, D) in rank order; backward: the
        reduce-scatter of the gradient (all_to_all_single of the rank slices, then a sum)."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, x.contiguous())
            return torch.cat(parts, dim=2)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            rows = torch.stack(grad.chunk(dist.get_world_size(), dim=2)).contiguous()
            received = torch.empty_like(rows)
            dist.all_to_all_single(received, rows)
            return received.sum(dim=0)

    def attention(q: Any, k: Any, v: Any) -> Any:
        rank, cp = dist.get_rank(), dist.get_world_size()
        local = q.shape[2]
        kv = GatherSeq.apply(torch.cat([k, v], dim=1))  # one collective for both, rank order
        order = torch.argsort(torch.cat([positions(local, r, cp) for r in range(cp)]))
        k_all, v_all = kv.index_select(2, order).split(k.shape[1], dim=1)  # global order
        outs, chunk = [], local // 2
        for index, c in enumerate((rank, 2 * cp - 1 - rank)):
            # chunk c sees the keys before its end only: a prefix, masked on its diagonal
            seen = (c + 1) * chunk
            mask = torch.arange(seen)[None, :] <= torch.arange(c * chunk, seen)[:, None]
            outs.append(F.scaled_dot_product_attention(
                q[:, :, index * chunk:(index + 1) * chunk], k_all[:, :, :seen],
                v_all[:, :, :seen], attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1]))
        return torch.cat(outs, dim=2)

    return attention


class Side:
    """One timed side: forward + backward of `attention` on this rank's chunks."""

    def __init__(self, args: argparse.Namespace, attention: Any) -> None:
        import torch

        self.q, self.k, self.v = local_inputs(args, torch.float32)
        self.attention = attention

    def __call__(self) -> Any:
        for t in (self.q, self.k, self.v):
            t.grad = None
        out = self.attention(self.q, self.k, self.v)
        out.sum().backward()
        return out


def sides(args: argparse.Namespace) -> dict[str, Side]:
    """meshtrain's three types, the hand-written all_gather attention and its null copy."""
    import torch.distributed as dist

    from meshtrain_runtime.parallel.context import context_attention

    def meshtrain(comm_type: str) -> Any:
        return lambda q, k, v: context_attention(q, k, v, group=dist.group.WORLD,
                                                 comm_type=comm_type, is_causal=True)

    hand = by_hand_attention()
    return {"all_gather": Side(args, meshtrain("all_gather")), "by_hand": Side(args, hand),
            "null": Side(args, hand), "p2p": Side(args, meshtrain("p2p")),
            "a2a": Side(args, meshtrain("a2a"))}


def measure_ratio(args: argparse.Namespace) -> dict[str, Any]:
    """Interleaved rounds of every side; per round each side's median over by_hand's."""
    from overhead import timed  # per-step wall seconds, CPU seconds summed over the ranks

    timed_sides = sides(args)
    difference = {name: float((side().detach() - timed_sides["by_hand"]().detach()).abs().max())
                  for name, side in timed_sides.items() if name != "by_hand"}
    for side in timed_sides.values():
        timed(side, args.warmup)
    others = [name for name in timed_sides if name != "by_hand"]
    rounds: dict[str, list[float]] = {f"{n}_{kind}": [] for n in others for kind in ("wall", "cpu")}
    samples: dict[str, list[float]] = {name: [] for name in timed_sides}
    for index in range(args.rounds):
        wall, cpu = {}, {}
        order = list(timed_sides) if index % 2 == 0 else list(reversed(timed_sides))
        for name in order:
            times, cpu[name] = timed(timed_sides[name], args.steps)
            samples[name].extend(times)
            wall[name] = statistics.median(times)
        for name in others:
            rounds[f"{name}_wall"].append(wall[name] / wall["by_hand"])
            rounds[f"{name}_cpu"].append(cpu[name] / cpu["by_hand"])
    return {"rounds": rounds, "max_abs_diff_vs_by_hand": difference,
            "step_ms": {k: 1e3 * statistics.median(v) for k, v in samples.items()}}


def run_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    result = {"bytes": measure_bytes(args), "ratio": measure_ratio(args),
              "ranks": dist.get_world_size()}
    if dist.get_rank() == 0:
        Path(args.raw).write_text(json.dumps(result))


# ---- the launcher and the summary (no torch) ----

def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The report entry: bytes vs theory per type and dtype, ratios with quartiles."""
    import report

    rounds = raw["ratio"]["rounds"]
    ratio = {key: report.summarize_ratios(values) for key, values in rounds.items()}
    return {"cp": raw["ranks"], "shape": {k: getattr(args, k) for k in SHAPE_KEYS},
            "bytes": raw["bytes"],
            "bytes_equal_theory": all(e["equal"] for by_dtype in raw["bytes"].values()
                                      for e in by_dtype.values()),
            "ratio": ratio, "step_ms": raw["ratio"]["step_ms"],
            "max_abs_diff_vs_by_hand": raw["ratio"]["max_abs_diff_vs_by_hand"]}


SHAPE_KEYS = ("batch", "heads", "kv_heads", "head_dim", "seq")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 2 rounds, 1 step")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--cp", type=int, default=2, help="ranks (the cp group)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved ratio rounds")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round and side")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4, help="GQA when below --heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq", type=int, default=2048, help="whole sequence (2 cp divides it)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.steps, args.warmup = 2, 1, 1
        args.heads, args.kv_heads, args.head_dim, args.seq = 4, 2, 8, 64
    if args.seq % (2 * args.cp) or args.heads % args.cp or args.kv_heads % args.cp:
        parser.error(f"--seq {args.seq} must divide into 2 x cp = {2 * args.cp} chunks and "
                     f"--heads {args.heads} / --kv-heads {args.kv_heads} by cp {args.cp} (a2a)")
    return args


def launch(args: argparse.Namespace, timeout: int = 1800) -> dict[str, Any]:
    """Run the worker on --cp ranks; return rank 0's raw measurements."""
    paths = [str(HERE.parent / "sdk"), str(HERE.parent / "runtime"), str(HERE)]
    old = os.environ.get("PYTHONPATH")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(paths + ([old] if old else []))}
    keys = ("rounds", "steps", "warmup", *SHAPE_KEYS)
    argv = [item for key in keys for item in (f"--{key.replace('_', '-')}",
                                               str(getattr(args, key)))]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={args.cp}", "-m", "meshtrain_runtime.host.rank_entry",
                   str(Path(__file__).resolve()), *argv, "--cp", str(args.cp), "--worker",
                   "--raw", str(raw)]
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if done.returncode != 0 or not raw.exists():
            raise RuntimeError(f"bench_context workers failed ({done.returncode}):\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return json.loads(raw.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(HERE))
    if args.worker:
        run_worker(args)
        return 0
    load_start = [round(v, 2) for v in os.getloadavg()]
    result = summarize(launch(args), args)
    result["load"] = {"start": load_start, "end": [round(v, 2) for v in os.getloadavg()],
                      "cpus": os.cpu_count()}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("bytes_equal_theory", "ratio", "step_ms", "load")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
