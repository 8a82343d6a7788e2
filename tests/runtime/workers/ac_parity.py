"""Checkpointing / offloading parity on real layouts (4 gloo ranks), reported per rank.

Layouts, each built as transform will (TP, then activation checkpointing, then FSDP2):
  hsdp_2x2   fully_shard on a (replicate=2, shard=2) mesh, blocks then root;
  tp2_fsdp2  torch TP (colwise/rowwise Llama projections) on tp=2, fully_shard on dp=2;
  tp2        TP alone on tp=2 (the two dp halves run the same global batch, no sync).
Variants per layout: plain, ac (every block), ac_every2, selective (op-level: matmul and
attention outputs kept), selective_every2, offload (meshtrain, horizon 2), offload_native
(save_on_cpu), selective_offload. Two AdamW steps each. Rank 0 compares every variant with a
single-process run (computed on every rank) and with the plain variant; then DTensor-input
offload cases. Every rank reports one record per case through report.py.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from report import report
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)
from transformers import LlamaConfig, LlamaForCausalLM

from meshtrain_runtime.parallel.activations import (
    apply_activation_checkpointing,
    get_offload_stats,
)

SEED, GLOBAL_BATCH, SEQ, STEPS = 1234, 4, 32, 2
VARIANTS = {
    "plain": None,
    "ac": {},
    "ac_every2": {"interval": 2},
    "selective": {"policy": "selective"},
    "selective_every2": {"policy": "selective", "interval": 2},
    "offload": {"offload": True, "loading_horizon": 2},
    "offload_native": {"offload": True, "native_offload": True},
    "selective_offload": {"policy": "selective", "offload": True, "loading_horizon": 2},
}
TP_PLAN = {
    "self_attn.q_proj": ColwiseParallel(),
    "self_attn.k_proj": ColwiseParallel(),
    "self_attn.v_proj": ColwiseParallel(),
    "self_attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(),
    "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(),
}


def build_model() -> LlamaForCausalLM:
    torch.manual_seed(SEED)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def global_batch() -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED + 1)
    return torch.randint(0, 128, (GLOBAL_BATCH, SEQ), generator=generator)


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    grads = {}
    for name, param in model.named_parameters():
        grad = param.grad
        grads[name] = grad.full_tensor() if isinstance(grad, DTensor) else grad.detach().clone()
    return grads


def train(model: nn.Module, batch: torch.Tensor, dp_group: dist.ProcessGroup | None) -> dict:
    """Two AdamW steps; losses are averaged over the data-parallel group (the global loss)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses, grads = [], []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = model(batch, labels=batch).loss
        loss.backward()
        value = loss.detach().clone()
        if dp_group is not None:
            dist.all_reduce(value, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(value.item())
        grads.append(full_grads(model))
        optimizer.step()
    return {"losses": losses, "grads": grads}


def build_layout(layout: str, variant: str) -> tuple[nn.Module, torch.Tensor, object]:
    model, batch = build_model(), global_batch()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    layers = list(model.model.layers)
    if layout.startswith("tp2"):
        for layer in layers:
            parallelize_module(layer, mesh["tp"], TP_PLAN)
    if VARIANTS[variant] is not None:
        apply_activation_checkpointing(model, layers, **VARIANTS[variant])
    if layout == "hsdp_2x2":
        hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        for layer in layers:
            fully_shard(layer, mesh=hsdp)
        fully_shard(model, mesh=hsdp)
        return model, batch.chunk(4)[dist.get_rank()], dist.group.WORLD
    if layout == "tp2_fsdp2":
        for layer in layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        dp_rank = mesh["dp"].get_local_rank()
        return model, batch.chunk(2)[dp_rank], mesh["dp"].get_group()
    return model, batch, None


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def compare(result: dict, reference: dict, plain: dict | None) -> dict:
    out = {
        "losses": result["losses"],
        "loss_diff_vs_single": max(
            abs(x - y) for x, y in zip(result["losses"], reference["losses"], strict=True)
        ),
        "grad_diff_vs_single": max(
            max_diff(g, r) for g, r in zip(result["grads"], reference["grads"], strict=True)
        ),
    }
    if plain is not None:
        out["loss_diff_vs_plain"] = max(
            abs(x - y) for x, y in zip(result["losses"], plain["losses"], strict=True)
        )
        out["grads_bit_identical_to_plain"] = all(
            torch.equal(g[k], p[k])
            for g, p in zip(result["grads"], plain["grads"], strict=True)
            for k in g
        )
    return out


def run_layouts(reference: dict) -> None:
    for layout in ("hsdp_2x2", "tp2_fsdp2", "tp2"):
        plain = None
        for variant in VARIANTS:
            model, batch, group = build_layout(layout, variant)
            result = train(model, batch, group)
            plain = plain or result
            entry = compare(result, reference, None if variant == "plain" else plain)
            stats = get_offload_stats(model)
            if stats is not None:
                entry["blocks_offloaded"] = stats.blocks_offloaded
                entry["max_resident_blocks"] = stats.max_resident_blocks
            report({"case": f"{layout}/{variant}", **entry})


def run_dtensor_inputs() -> None:
    """Offload DTensor block inputs through both offloaders; grads must match no offload."""
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    for name, kwargs in (("none", None), ("offload", {"offload": True}),
                         ("offload_native", {"offload": True, "native_offload": True})):
        torch.manual_seed(SEED)
        model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(3)))
        for layer in model:  # outputs stay DTensors: every block receives a DTensor
            parallelize_module(layer, mesh, ColwiseParallel(use_local_output=False))
        if kwargs is not None:
            apply_activation_checkpointing(model, list(model), **kwargs)
        x = distribute_tensor(torch.randn(16, 8, generator=torch.Generator().manual_seed(7)),
                              mesh, [Shard(0)])
        model(x).full_tensor().square().sum().backward()
        stats = get_offload_stats(model)
        report({
            "case": f"dtensor_input/{name}",
            "grads": [p.grad.full_tensor().tolist() for p in model.parameters()],
            "tensors_offloaded": stats.tensors_offloaded if stats else 0,
        })


def main() -> None:
    # full_tensor() of TP+FSDP gradients warns about sequential all-gathers: expected here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo")
    reference = train(build_model(), global_batch(), None)  # one process, the whole batch
    report({"case": "reference", "losses": reference["losses"]})
    run_layouts(reference)
    run_dtensor_inputs()


if __name__ == "__main__":
    main()
