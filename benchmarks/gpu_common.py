"""What the one-GPU benchmarks share: the ~1.1B Llama model's arguments, the model itself, the
GPU check and step timing (gpu_throughput.py, gpu_activation_offload.py)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

GIB = 1024**3


def add_arguments(parser: argparse.ArgumentParser, *, seq_len: int, batch_size: int,
                  warmup: int, steps: int) -> None:
    """TinyLlama's shape (hidden 2048, 22 layers, GQA 32/4 heads), the run's lengths, --json
    and --smoke."""
    for name, default in (("layers", 22), ("hidden", 2048), ("intermediate", 5632),
                          ("heads", 32), ("kv-heads", 4), ("vocab", 32000), ("seq-len", seq_len),
                          ("batch-size", batch_size), ("warmup", warmup), ("steps", steps)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model on any device: checks the script, not performance")


def shrink_for_smoke(args: argparse.Namespace, *, layers: int, seq_len: int, warmup: int,
                     steps: int) -> None:
    """With --smoke: a tiny model (hidden 64, 4/2 heads, vocab 128) and few steps."""
    if args.smoke:
        args.layers, args.hidden, args.intermediate, args.heads, args.kv_heads = \
            layers, 64, 128, 4, 2
        args.vocab, args.seq_len, args.batch_size, args.warmup, args.steps = \
            128, seq_len, 2, warmup, steps


def build_llama(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The HF Llama of `args`' shape on `device`, fp32, in train mode, from seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
        max_position_embeddings=args.seq_len, attn_implementation="sdpa",
        use_cache=False,  # else every variant keeps a KV cache (~2 GiB at 1.1B, seq 4096)
    )
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).train()


def require_gpu_unless_smoke(script: str, smoke: bool) -> bool:
    """False (after saying why on stderr) when there is no CUDA GPU and this is not --smoke."""
    if torch.cuda.is_available() or smoke:
        return True
    print(f"{script} needs a CUDA GPU: torch.cuda.is_available() is False on this host. Run it "
          "on a GPU machine, or pass --smoke for a tiny run that only checks the script (no "
          "meaningful numbers).", file=sys.stderr)
    return False


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(step: Callable[[], None], count: int, device: torch.device) -> list[float]:
    """Wall seconds of each of `count` steps, the device synchronised around each."""
    times = []
    for _ in range(count):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times
