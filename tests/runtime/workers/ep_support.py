"""Models, meshes, gradient comparison and parameter accounting for the EP worker scripts.

Every case runs the same model twice on every rank: a single-process reference on the whole
global batch, and the expert-parallel copy on this rank's slice of it (EP ranks are
data-parallel ranks). Errors are reduced with MAX over ranks so rank 0 can report them.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from ranks import full, max_over_ranks
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import MixtralConfig, MixtralForCausalLM

from meshtrain_runtime.modules.moe import MoE, MoEConfig, moe_aux_loss
from meshtrain_runtime.parallel.expert import (
    apply_expert_parallel,
    expert_parallel_modules,
    shard_experts_with_fsdp,
)

VOCAB = 64
SEQ = 8
LOCAL_BATCH = 2
LR = 0.5


@dataclass(frozen=True)
class Layout:
    """A world split as replicate x shard (= shard_mod_ep x ep), tp = 1."""

    replicate: int
    shard: int
    ep: int
    fsdp: bool = True

    @property
    def shard_mod_ep(self) -> int:
        return self.shard // self.ep

    @property
    def dp(self) -> int:
        return self.replicate * self.shard


def build_meshes(layout: Layout) -> tuple[DeviceMesh, DeviceMesh]:
    """(main mesh (replicate, shard, tp), expert mesh (replicate, shard_mod_ep, ep))."""
    main = init_device_mesh(
        "cpu", (layout.replicate, layout.shard, 1), mesh_dim_names=("replicate", "shard", "tp")
    )
    expert = init_device_mesh(
        "cpu",
        (layout.replicate, layout.shard_mod_ep, layout.ep),
        mesh_dim_names=("replicate", "shard_mod_ep", "ep"),
    )
    return main, expert


def tiny_mixtral(top_k: int, num_experts: int = 4, aux_coef: float = 0.02) -> MixtralForCausalLM:
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=num_experts,
        num_experts_per_tok=top_k,
        max_position_embeddings=64,
        router_aux_loss_coef=aux_coef,
    )
    torch.manual_seed(0)
    return MixtralForCausalLM(config)


def global_tokens(layout: Layout, seed: int = 1, *, starve: bool = False) -> torch.Tensor:
    """The global batch. `starve`: one repeated token, so every position of every sequence has
    the same hidden state and all tokens pick the same top-k experts: the others get none."""
    torch.manual_seed(seed)
    if starve:
        return torch.full((layout.dp * LOCAL_BATCH, SEQ), 7)
    return torch.randint(0, VOCAB, (layout.dp * LOCAL_BATCH, SEQ))


def local_rows(tensor: torch.Tensor, layout: Layout) -> torch.Tensor:
    """This rank's data-parallel slice (tp = 1, so the dp index is the global rank)."""
    rank = dist.get_rank()
    per_rank = tensor.shape[0] // layout.dp
    return tensor[rank * per_rank : (rank + 1) * per_rank]


def shard_model(model: nn.Module, layout: Layout, main: DeviceMesh, expert: DeviceMesh,
                blocks: list[nn.Module]) -> None:
    """The transform's design order: experts over shard_mod_ep, then blocks, then the root."""
    axes = ("replicate", "shard_mod_ep") if layout.replicate > 1 else ("shard_mod_ep",)
    shard_experts_with_fsdp(model, expert[axes])
    dp_mesh = main["replicate", "shard"] if layout.replicate > 1 else main["shard"]
    for block in blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def average_plain_grads(model: nn.Module, layout: Layout) -> None:
    """What FSDP does, by hand, for the no-FSDP case (requires dp == ep: no expert replicas)."""
    assert layout.dp == layout.ep, "hand averaging is written for dp == ep"
    for param in model.parameters():
        grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
        if not isinstance(param, DTensor):
            dist.all_reduce(grad)  # expert grads already hold every EP rank's tokens
        grad.div_(layout.dp)






def mean_over_ranks(value: torch.Tensor) -> float:
    t = value.detach().to(torch.float64).reshape(1).clone()
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def named_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters by their reference name (activation checkpointing wrappers add a prefix)."""
    return {
        name.replace("_checkpoint_wrapped_module.", ""): param
        for name, param in model.named_parameters()
    }


def grad_errors(model: nn.Module, reference: nn.Module) -> dict[str, float]:
    """Max |grad - reference grad| per parameter (same names; DTensors gathered)."""
    params = named_parameters(model)
    errors = {}
    for name, ref_param in reference.named_parameters():
        grad = params[name].grad
        got = full(grad) if grad is not None else torch.zeros_like(ref_param)
        errors[name] = max_over_ranks((got - ref_param.grad).abs().max().item())
    return errors


def param_errors(model: nn.Module, reference: nn.Module) -> float:
    params = named_parameters(model)
    worst = 0.0
    for name, ref_param in reference.named_parameters():
        worst = max(worst, (full(params[name].detach()) - ref_param.detach()).abs().max().item())
    return max_over_ranks(worst)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def expert_accounting(
    model: nn.Module, reference: nn.Module, layout: Layout, *, fsdp_applied: bool
) -> dict[str, Any]:
    """What each rank stores for experts, against the full model's expert parameters."""
    ep_modules = expert_parallel_modules(model)
    local_numel = sum(_local(p).numel() for m in ep_modules for p in m.parameters())
    local_bytes = sum(
        _local(p).untyped_storage().nbytes() for m in ep_modules for p in m.parameters()
    )
    ref_numel = sum(
        p.numel() for n, p in reference.named_parameters() if n.endswith(("_proj",)) and
        ("experts." in n)
    )
    holds = sorted({m.first_expert + i for m in ep_modules for i in range(m.num_local_experts)})
    return {
        "rank": dist.get_rank(),
        "local_expert_numel": local_numel,
        "local_expert_storage_bytes": local_bytes,
        "full_expert_numel": ref_numel,
        # HSDP's replicate axis copies, it does not shard.
        "expected_numel": ref_numel // (layout.ep * (layout.shard_mod_ep if fsdp_applied else 1)),
        "experts_held": holds,
        "local_slices_match": None if fsdp_applied else _slices_match(ep_modules, model, reference),
    }


def _slices_match(ep_modules: list, model: nn.Module, reference: nn.Module) -> bool:
    ref_params = dict(reference.named_parameters())
    names = {id(p): n for n, p in named_parameters(model).items()}
    for module in ep_modules:
        for param in module.parameters():
            ref = ref_params[names[id(param)]]
            start = module.first_expert
            if not torch.equal(_local(param), ref[start : start + module.num_local_experts]):
                return False
    return True


def gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def global_expert_load(model: nn.Module) -> list[list[int]]:
    """Tokens each expert received in the latest forward, per EP layer, summed over ranks."""
    loads = []
    for module in expert_parallel_modules(model):
        counts = torch.zeros(module.num_experts, dtype=torch.int64)
        start = module.first_expert
        counts[start : start + module.num_local_experts] = torch.tensor(module.last_local_tokens)
        dist.all_reduce(counts)
        # Replicas of an EP group (shard_mod_ep x replicate) see different tokens: all count.
        loads.append(counts.tolist())
    return loads


# ----------------------------------------------------------------------------- custom MoE model


class MoENet(nn.Module):
    """A custom model with two meshtrain MoE layers (top-2 Mixtral-style, top-1 Switch-style)."""

    def __init__(self, config: MoEConfig, hidden: int = 9) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(hidden, hidden)
        self.moe1 = MoE(hidden, 6, num_experts=4, top_k=2, config=config, layer_id=0)
        self.moe2 = MoE(hidden, 6, num_experts=4, top_k=1, config=config,
                        norm_topk_prob=False, activation="gelu", layer_id=1)
        self.out = nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = h + self.moe1(h)
        h = h + self.moe2(h)
        return self.out(h.reshape(-1, h.shape[-1]))  # 2-D: a fresh tensor for FSDP's root


def moe_net_loss(model: MoENet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y.reshape(-1, y.shape[-1])) + moe_aux_loss(model)


def clone_for_ep(reference: nn.Module) -> nn.Module:
    return copy.deepcopy(reference)


def ep_apply(model: nn.Module, expert: DeviceMesh, moe_config: MoEConfig | None) -> nn.Module:
    return apply_expert_parallel(model, expert, moe_config=moe_config)
