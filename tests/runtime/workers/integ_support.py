"""Models, batches, training loops and comparisons for the transform() integration workers.

Every case goes through the public path: ``meshtrain_runtime.init(params)`` then
``meshtrain_runtime.transform(model)``. The single-process reference (the same initial weights,
the whole global batch, the same optimizer and clipping) is trained on every rank in the same
launch, so no extra process start-up is needed. Data-parallel ranks take their rows of each
global batch by ``state.dp_rank`` (tensor-parallel ranks of one group get the same rows).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from ranks import full, local, max_over_ranks
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
)

import meshtrain_runtime as mr
from meshtrain_runtime.grad import total_grad_norm
from meshtrain_runtime.parallel.activations import checkpointed_blocks

VOCAB = 64
SEQ = 8
LOCAL_BATCH = 2
STEPS = 3
LR = 1e-2
CLIP = 0.5  # below the gradient norms of these models (~1-4): clipping really scales
NORM_TYPES = (1.0, math.inf)


def build_model(kind: str, *, layers: int = 2, top_k: int = 2, aux_coef: float = 0.02,
                meta: bool = False) -> nn.Module:
    """A tiny HF model of `kind` (llama, neox, mixtral), the same on every rank (seed 0)."""
    small = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                 vocab_size=VOCAB, max_position_embeddings=32)
    if kind == "llama":
        cls, config = LlamaForCausalLM, LlamaConfig(**small, num_attention_heads=4,
                                                    num_key_value_heads=2)
    elif kind == "neox":
        cls, config = GPTNeoXForCausalLM, GPTNeoXConfig(**small, num_attention_heads=4)
    elif kind == "mixtral":
        cls, config = MixtralForCausalLM, MixtralConfig(
            **small, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=top_k, router_aux_loss_coef=aux_coef)
    else:
        raise ValueError(kind)
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return cls(config)
    return cls(config)


def global_batch(dp_size: int, step: int) -> torch.Tensor:
    """Step `step`'s global batch: dp_size x LOCAL_BATCH rows, identical on every rank."""
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (dp_size * LOCAL_BATCH, SEQ), generator=generator)


def local_rows(batch: torch.Tensor) -> torch.Tensor:
    rank = mr.state.dp_rank
    return batch[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]


def causal_lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """HF's own loss; MoE models add their router loss (global over EP ranks under EP)."""
    extra = {"output_router_logits": True} if isinstance(model, MixtralForCausalLM) else {}
    return model(input_ids=ids, labels=ids, use_cache=False, **extra).loss








def all_ranks(value: bool) -> bool:
    t = torch.tensor([0 if value else 1])
    dist.all_reduce(t)
    return int(t.item()) == 0


def global_mean(loss: torch.Tensor) -> float:
    """Mean over all ranks: tp ranks hold equal values, so this is the mean over dp ranks."""
    value = loss.detach().to(torch.float64).reshape(1).clone()
    dist.all_reduce(value)
    return float(value.item()) / dist.get_world_size()


def partial_gradients(model: nn.Module) -> list[str]:
    """Parameters whose gradient is still a Partial DTensor (an unreduced SP norm gradient)."""
    return [
        name for name, p in model.named_parameters()
        if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)
    ]


def train_parallel(model: nn.Module, *, clip: bool) -> dict[str, Any]:
    """STEPS AdamW steps (torch defaults, foreach) on this rank's rows; records the first step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    out: dict[str, Any] = {"losses": [], "clip_norms": []}
    for step in range(STEPS):
        loss = causal_lm_loss(model, local_rows(global_batch(mr.state.dp_size, step)))
        loss.backward()
        if step == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            out["partial_grads"] = partial_gradients(model)
            out["norms"] = [float(total_grad_norm(grads, p)) for p in NORM_TYPES]
        if clip:
            out["clip_norms"].append(float(mr.clip_grad_norm_(model, CLIP)))
        if step == 0:
            out["grads"] = {n: full(p.grad).clone() for n, p in model.named_parameters()}
            out["local_grads"] = {n: local(p.grad).clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        out["losses"].append(global_mean(loss))
    return out


def train_reference(model: nn.Module, dp_size: int, *, clip: bool) -> dict[str, Any]:
    """The single process: the whole global batch of every step, torch's own clipping."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    out: dict[str, Any] = {"losses": [], "clip_norms": []}
    for step in range(STEPS):
        loss = causal_lm_loss(model, global_batch(dp_size, step))
        loss.backward()
        if step == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            out["norms"] = [float(torch.nn.utils.get_total_norm(grads, p)) for p in NORM_TYPES]
        if clip:
            out["clip_norms"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                                          CLIP)))
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        out["losses"].append(float(loss.detach()))
    return out


def compare(run: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Errors of a parallel run against the reference (maxed over ranks)."""
    def rel(a: float, b: float) -> float:
        return abs(a - b) / max(abs(b), 1e-12)

    grad_errors = {n: (g - reference["grads"][n]).abs().max().item()
                   for n, g in run["grads"].items()}
    worst = max(grad_errors, key=grad_errors.get)
    return {
        "losses": run["losses"],
        "ref_losses": reference["losses"],
        "loss_err": max_over_ranks(max(abs(a - b) for a, b in
                                       zip(run["losses"], reference["losses"], strict=True))),
        "clip_norms": run["clip_norms"],
        "ref_clip_norms": reference["clip_norms"],
        "clip_norm_rel_err": max_over_ranks(max(
            (rel(a, b) for a, b in zip(run["clip_norms"], reference["clip_norms"], strict=True)),
            default=0.0)),
        "norm_rel_err": max_over_ranks(max(
            rel(a, b) for a, b in zip(run["norms"], reference["norms"], strict=True))),
        "grad_err": max_over_ranks(grad_errors[worst]),
        "worst_grad": worst,
        "partial_grads": run["partial_grads"],
    }


def placements(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each parameter's mesh axes and placements (all parameters are DTensors after transform)."""
    out = {}
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            out[name] = {"axes": None, "placements": None}
            continue
        out[name] = {"axes": list(param.device_mesh.mesh_dim_names or ()),
                     "placements": [repr(p) for p in param.placements]}
    return out


def run_case(params: dict[str, Any], build: Callable[[], nn.Module], *, clip: bool = True,
             references: dict | None = None, key: Any = None,
             adjust_reference: Callable[[nn.Module], None] | None = None,
             **transform_kwargs: Any) -> dict[str, Any]:
    """init(params) -> transform -> train; the reference for `key` is trained once per launch.

    `adjust_reference(model)` changes the reference after the copy (what transform's options
    should change in the parallel model, e.g. an MoEConfig's router-loss coefficient).
    """
    mr.reset()
    mr.init(params)
    reference_model = build()
    model = mr.transform(copy.deepcopy(reference_model), **transform_kwargs)
    if adjust_reference is not None:
        adjust_reference(reference_model)
    layout = placements(model)
    dp_size = mr.state.dp_size
    references = {} if references is None else references
    ref_key = (key, dp_size, clip)
    if ref_key not in references:
        references[ref_key] = train_reference(reference_model, dp_size, clip=clip)
    tp_info = getattr(model, "meshtrain_tp", None)
    result = compare(train_parallel(model, clip=clip), references[ref_key])
    return {**result, "placements": layout, "dp_size": dp_size,
            "degrees": mr.state.degrees.__dict__, "fsdp": isinstance(model, FSDPModule),
            "tp_sequence_parallel": tp_info.sequence_parallel if tp_info else None,
            "checkpointed": len(checkpointed_blocks(model))}
