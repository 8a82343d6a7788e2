"""What the one-GPU benchmarks share: the ~1.1B Llama model's arguments, the model itself, the
GPU check, step timing (gpu_throughput.py, gpu_activation_offload.py, gpu_check_planner.py) and
the two sides of a pair: the layout written by hand with torch and the same through transform(),
with the check that both built the same FSDP groups."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

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


# ------------------------------------------------------------------ the two sides of a pair
HAND_RESHARD_AFTER_FORWARD = False
"""The hand-written layout's blocks and embedding keep their gathered parameters from forward
to backward: on a world of one there is nothing to gather again, and transform() resolves the
same (``reshard_after_forward: "auto"`` with a shard group of one is no_shard's choice).
`check_same_layout` fails the run when transform() resolves otherwise."""

_WRAPPER_PREFIX = re.compile(r"(_checkpoint_wrapped_module|_offload_wrapped_module|_orig_mod)\.?")


HAND_SELECTIVE_OPS = ("mm", "addmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention",
                      "_scaled_dot_product_cudnn_attention",
                      "_scaled_dot_product_flash_attention_for_cpu", "max")
"""The hand-written side's selective checkpointing (``sac``): torch's own
``create_selective_checkpoint_contexts`` keeping every matmul and fused attention output, as
torchtitan's op-level policy does (without its every-second-mm recompute, which trades speed
for memory): the same work as transform()'s "selective", written with torch alone."""


def hand_selective_context() -> Any:
    """checkpoint_wrapper's ``context_fn`` for the hand-written selective checkpointing."""
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    ops = [getattr(torch.ops.aten, name).default for name in HAND_SELECTIVE_OPS
           if hasattr(torch.ops.aten, name)]
    return functools.partial(create_selective_checkpoint_contexts, ops)


def setup_flags(setup: str) -> dict[str, bool]:
    """What a pair's name asks for (``ac_compile_fused`` -> checkpointing, compile, fused;
    ``sac``: selective checkpointing)."""
    parts = setup.split("_")
    return {"ac": "ac" in parts, "sac": "sac" in parts, "compile": "compile" in parts,
            "fused": "fused" in parts,
            "fp8": "fp8" in parts, "offload": "offload" in parts and "cpu" not in parts,
            "cpu_offload": "cpu" in parts}


def by_hand(setup: str, model: nn.Module, device: torch.device) -> nn.Module:
    """torchtitan's order written out with torch alone: float8 linears, checkpointing (with
    torch's save_on_cpu per checkpointed block for offloading), compile per block, then
    fully_shard on the embedding, each block, the head (kept gathered) and the root."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
        offload_wrapper,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    flags = setup_flags(setup)
    if flags["fp8"]:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn != "lm_head")
    layers = model.model.layers
    for index, block in enumerate(layers):
        if flags["ac"] or flags["sac"]:
            block = checkpoint_wrapper(block, context_fn=hand_selective_context()) \
                if flags["sac"] else checkpoint_wrapper(block)
            layers[index] = offload_wrapper(block) if flags["offload"] else block
        if flags["compile"]:
            layers[index].compile()
    kwargs = {"mesh": init_device_mesh(device.type, (1,)),
              "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                reduce_dtype=torch.float32)
              if device.type == "cuda" else MixedPrecisionPolicy(),
              "offload_policy": CPUOffloadPolicy(pin_memory=True) if flags["cpu_offload"]
              else OffloadPolicy()}
    fully_shard(model.get_input_embeddings(), reshard_after_forward=HAND_RESHARD_AFTER_FORWARD,
                **kwargs)
    for block in layers:
        fully_shard(block, reshard_after_forward=HAND_RESHARD_AFTER_FORWARD, **kwargs)
    fully_shard(model.get_output_embeddings(), reshard_after_forward=False, **kwargs)
    return fully_shard(model, **kwargs)


def through_transform(setup: str, model: nn.Module, device: torch.device) -> nn.Module:
    """The same setup through meshtrain_runtime.init() / transform() (a world of one)."""
    import meshtrain_runtime as mr

    flags = setup_flags(setup)
    params: dict[str, Any] = {
        "activation_checkpointing": "selective" if flags["sac"] else flags["ac"],
        "compile": flags["compile"],
        "activation_offloading": flags["offload"], "cpu_offload": flags["cpu_offload"],
        "fp8": flags["fp8"],
    }
    if device.type == "cuda":
        params["mixed_precision"] = "bf16"
    mr.reset()
    mr.init(params)
    return mr.transform(model)


def fsdp_layout(model: nn.Module) -> list[dict[str, Any]]:
    """Each FSDP group of `model` (checkpoint / offload wrappers left out of the names): its
    module, parameter count, reshard_after_forward as FSDP2 holds it after a step (the root
    always keeps its parameters), compute dtype and offload policy."""
    from torch.distributed.fsdp import FSDPModule

    groups = []
    for name, module in model.named_modules():
        group = module._get_fsdp_state()._fsdp_param_group \
            if isinstance(module, FSDPModule) else None
        if group is None:
            continue
        groups.append({
            "module": _WRAPPER_PREFIX.sub("", name) or "<root>",
            "parameters": len(group.fsdp_params),
            "reshard_after_forward": group.post_forward_mesh_info is not None,
            "param_dtype": str(group.mp_policy.param_dtype),
            "offload_policy": type(group.offload_policy).__name__,
        })
    return groups


def describe_layout(groups: list[dict[str, Any]]) -> str:
    """One line for the report: the groups and which ones reshard after forward."""
    blocks = [g for g in groups if g["module"] not in ("<root>",) and ".layers." in g["module"]]
    others = [g for g in groups if g not in blocks]
    text = ", ".join(f"{g['module']} (reshard {g['reshard_after_forward']})" for g in others)
    reshard = sorted({g["reshard_after_forward"] for g in blocks})
    return (f"{len(groups)} FSDP groups: {len(blocks)} blocks (reshard_after_forward "
            f"{'/'.join(map(str, reshard))}), {text}; param_dtype {groups[0]['param_dtype']}, "
            f"{groups[0]['offload_policy']}") if groups else "no FSDP groups"


class LayoutMismatch(RuntimeError):
    """transform() built other FSDP groups than the hand-written side of a pair."""


def check_same_layout(setup: str, hand: nn.Module, ours: nn.Module) -> list[dict[str, Any]]:
    """The layout both sides share; LayoutMismatch naming the difference when they differ."""
    theirs, mine = fsdp_layout(hand), fsdp_layout(ours)
    if theirs != mine:
        diff = [(a, b) for a, b in zip(theirs, mine, strict=False) if a != b][:3]
        raise LayoutMismatch(f"{setup}: transform() built another FSDP layout than the "
                           f"hand-written side ({len(mine)} vs {len(theirs)} groups; first "
                           f"differences (hand, transform): {diff}); the pair would not compare "
                           "the same layout")
    return mine
