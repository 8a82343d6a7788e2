"""Tiny HF models and byte counters shared by the planner-calibration workers.

The workers only measure; tests/runtime/test_plan_calibration_multiprocess.py asks the planner
for its estimate of each reported case (from the reported HF config and SMP parameters) and
compares. Every layout is built by ``meshtrain_runtime.transform`` from the parameters given to
``meshtrain_runtime.init``, as a training script builds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from ranks import local
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

from meshtrain_runtime.diagnostics.collectives import count_collectives
from meshtrain_runtime.diagnostics.memory import PhaseMemoryMeter

SEED = 0
VOCAB = 128

# intermediate_size 170 does not split evenly over 4 ranks (ceil: 43 rows, the last rank 41)
# nor over tp 2 x shard 2 (85 -> 43 and 42 rows), so FSDP2's padding is exercised too.
LLAMA_SHAPE = {
    "hidden_size": 64, "intermediate_size": 170, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


def llama_config(**overrides: Any) -> LlamaConfig:
    """The tiny Llama every case uses (SDPA attention, fp32, no dropout)."""
    config = LlamaConfig(**{**LLAMA_SHAPE, **overrides})
    config._attn_implementation = "sdpa"
    return config


def mixtral_config() -> MixtralConfig:
    """A tiny Mixtral: 4 experts, top-2, so that ep=2 keeps 2 experts per rank."""
    config = MixtralConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=256, tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    return config


def build_model(config: LlamaConfig | MixtralConfig) -> nn.Module:
    """The same weights on every rank (same seed), in training mode."""
    torch.manual_seed(SEED)
    cls = MixtralForCausalLM if isinstance(config, MixtralConfig) else LlamaForCausalLM
    return cls(config).train()


def config_record(config: LlamaConfig | MixtralConfig) -> dict[str, Any]:
    """What the test side needs to rebuild the planner's ModelSpec (JSON-serialisable)."""
    record = config.to_dict()
    record["_attn_implementation"] = "sdpa"
    return {k: v for k, v in record.items() if _jsonable(v)}


def _jsonable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | type(None) | list | dict)




def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind the local parts of `tensors`.

    FSDP2 keeps each sharded parameter in a storage padded to ceil(rows / shard) rows and
    writes the reduce-scattered gradients of a group into one padded flat buffer, so this is
    what the rank really allocates, padding included.
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = local(tensor).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Per-rank bytes of parameters, gradients and optimizer state (AdamW: exp_avg, exp_avg_sq;
    the 0-d ``step`` counters are bookkeeping the planner leaves out)."""
    params = list(model.parameters())
    states = [
        value for state in optimizer.state.values() for key, value in state.items()
        if key != "step"
    ]
    return {
        "parameters": storage_bytes(params),
        "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
        "optimizer_states": storage_bytes(states),
        "num_params_without_grad": sum(p.grad is None for p in params),
    }


def phase_peaks(
    model: nn.Module, ids: torch.Tensor, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Peak bytes allocated above the step's start in each phase of one training step.

    The step is a script's: ``loss = model(...).loss`` (nobody keeps the logits), backward,
    then the optimizer step when given; gradients were set to None before (torch's default
    ``zero_grad``). Phase ends: the output head's forward pre-hook (forward), the gradient
    reaching the head's output (loss: the cross entropy's backward is done), the end of
    ``backward()`` and of ``optimizer.step()``.
    """
    head = model.get_output_embeddings()
    meter = PhaseMemoryMeter()

    def head_output(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        output.register_hook(lambda grad: meter.mark("loss"))

    hooks = [head.register_forward_pre_hook(lambda module, args: meter.mark("forward")),
             head.register_forward_hook(head_output)]
    with meter:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        meter.mark("backward")
        del loss
        # gloo's worker threads free their copy of a collective's buffer after the op has
        # returned; let them, so that the step starts from what backward left (as with NCCL,
        # which makes no copy).
        dist.barrier()
        time.sleep(0.05)
        if optimizer is not None:
            optimizer.step()
            meter.mark("optimizer_step")
    for hook in hooks:
        hook.remove()
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    return meter.peaks


def smaller_phase_peaks(
    model: nn.Module, ids: torch.Tensor, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """`phase_peaks` of the same step measured twice, each phase's smaller figure kept (as the
    tests keep the rank that measured least): the arithmetic is the same both times, so a
    one-off extra allocation (an AdamW-state-sized one in about 1 of 4 full-suite runs; a
    collective buffer gloo frees late, more of them on a loaded machine) cannot fail a test,
    while a wrong model shows in both. Gradients are set to None before each run."""
    runs = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        runs.append(phase_peaks(model, ids, optimizer))
    return {phase: min(run[phase] for run in runs) for phase in runs[0]}


def collectives_of(step: Callable[[], Any]) -> dict[str, dict[str, int]]:
    """Run `step` under the runtime's collective counter: counts and payload bytes by
    "phase/op" (payload: the whole logical tensor, e.g. an all-gather's output)."""
    stats = count_collectives(step)
    return {
        "counts": {f"{phase}/{op}": n for (phase, op), n in stats.counts.items()},
        "payload_bytes": {f"{phase}/{op}": n for (phase, op), n in stats.payload_bytes.items()},
    }
