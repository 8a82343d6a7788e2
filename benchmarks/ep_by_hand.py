"""Expert parallelism written by hand with torch alone: the ep baseline of overhead.py.

What a careful torch engineer writes for a Hugging Face Mixtral on ``ep`` ranks, with no
meshtrain code (tests/benchmarks/test_bench_report.py checks this module's imports): each MoE
layer's ``experts`` (``MixtralExperts``: fused ``gate_up_proj`` ``(E, 2I, H)`` and ``down_proj``
``(E, H, I)``) is replaced by `AllToAllExperts`, which keeps this rank's ``E / ep`` experts as
plain parameters and moves the tokens with torch's functional collectives
(``all_to_all_single`` for the counts, ``all_to_all_single_autograd`` for the rows, one host
sync for the split sizes). The router (HF's ``MixtralTopKRouter``: softmax, top-k, renormalise)
is the model's own and untouched, so both sides route the same tokens to the same experts.

Then FSDP2 as torchtitan lays it out: the experts of each layer ``fully_shard``-ed over the ranks
that hold the same experts (``efsdp`` axis, dim 1 when it divides), their gradients divided by
the whole data-parallel size (each expert's gradient already sums its EP group's tokens), and
the blocks, embedding, head and root over every rank. On gloo (no PREMUL_SUM) the experts'
reduce-scatter sums and divides afterwards.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import _functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard


class AllToAllExperts(nn.Module):
    """This rank's ``E / ep`` experts of one MoE layer; tokens move by all-to-all.

    Same call as ``MixtralExperts``: ``forward(hidden_states (T, H), top_k_index (T, k),
    top_k_weights (T, k)) -> (T, H)`` with global expert ids in `top_k_index`.
    """

    def __init__(self, experts: nn.Module, ep_mesh: DeviceMesh) -> None:
        super().__init__()
        self.num_experts = experts.gate_up_proj.shape[0]
        self.ep = ep_mesh.size()
        self.local = self.num_experts // self.ep
        first = ep_mesh.get_local_rank() * self.local
        self.gate_up_proj = nn.Parameter(
            experts.gate_up_proj.detach()[first:first + self.local].clone())
        self.down_proj = nn.Parameter(experts.down_proj.detach()[first:first + self.local].clone())
        self.act_fn = experts.act_fn
        self.group = ep_mesh.get_group()

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert (= by owner)
        token = torch.div(order, top_k_index.shape[1], rounding_mode="floor")
        counts = torch.bincount(flat, minlength=self.num_experts)
        recv_counts = funcol.wait_tensor(
            funcol.all_to_all_single(counts, None, None, self.group)).view(self.ep, self.local)
        # one host sync: rows to each rank, rows from each rank, rows of each local expert
        sizes = torch.cat([counts.view(self.ep, self.local).sum(1), recv_counts.sum(1),
                           recv_counts.sum(0)]).tolist()
        send, recv, per_expert = (sizes[:self.ep], sizes[self.ep:2 * self.ep],
                                  sizes[2 * self.ep:])
        received = funcol.all_to_all_single_autograd(hidden_states[token], recv, send, self.group)
        out = self._local_experts(received, recv_counts, per_expert)
        back = funcol.all_to_all_single_autograd(out, send, recv, self.group)
        weighted = back * top_k_weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(hidden_states).index_add(0, token, weighted)

    def _local_experts(self, received: torch.Tensor, recv_counts: torch.Tensor,
                       per_expert: list[int]) -> torch.Tensor:
        """`received` is ordered by source rank, then expert: regroup by expert, run, undo.
        Every expert runs, on zero rows too, so each weight gets a gradient on every rank (the
        experts' reduce-scatter needs one)."""
        expert_of_row = torch.arange(self.local).repeat(self.ep).repeat_interleave(
            recv_counts.reshape(-1), output_size=received.shape[0])
        by_expert = torch.argsort(expert_of_row, stable=True)
        outputs = []
        for expert, rows in enumerate(received[by_expert].split(per_expert)):
            gate, up = F.linear(rows, self.gate_up_proj[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(self.act_fn(gate) * up, self.down_proj[expert]))
        return torch.cat(outputs)[torch.argsort(by_expert)]


def expert_mesh(replicate: int, shard: int, ep: int) -> DeviceMesh:
    """(replicate, efsdp, ep) over the same ranks as the dense (replicate, shard) mesh, ep
    innermost: an EP group is ``ep`` neighbouring ranks of one shard group."""
    return init_device_mesh("cpu", (replicate, shard // ep, ep),
                            mesh_dim_names=("replicate", "efsdp", "ep"))


def expert_parallel_by_hand(model: nn.Module, mesh: DeviceMesh, *, compile_blocks: bool,
                            fsdp_rest: Any) -> nn.Module:
    """Swap every Mixtral MoE layer's experts for `AllToAllExperts` over ``mesh["ep"]``, shard
    them over the ranks holding the same experts, then `fsdp_rest(model)` shards the rest."""
    for layer in model.model.layers:
        layer.mlp.experts = AllToAllExperts(layer.mlp.experts, mesh["ep"])
        if compile_blocks:
            layer.compile()
    replicate, ep = mesh.size(0), mesh.size(2)
    fsdp_mesh = mesh["efsdp"] if replicate == 1 else mesh["replicate", "efsdp"]
    shards = mesh.size(1)
    for layer in model.model.layers:
        experts = layer.mlp.experts
        fully_shard(experts, mesh=fsdp_mesh, reshard_after_forward=True,
                    shard_placement_fn=lambda p: Shard(1) if p.shape[1] % shards == 0
                    else Shard(0))
        experts.set_gradient_divide_factor(float(fsdp_mesh.size() * ep))
        if shards > 1:  # gloo has no PREMUL_SUM (with one shard FSDP would divide twice)
            experts.set_force_sum_reduction_for_comms(True)
    return fsdp_rest(model)
