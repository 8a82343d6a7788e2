"""torchrun worker (4 ranks): tensor parallelism x expert parallelism against one process.

Each case builds the job's meshes as the runtime does (``build_state``: the EP group folded over
shard x tp), applies TP to attention/embedding/head (``tp_plan_without_experts``), EP with the
tokens split over tp before dispatch, FSDP2/HSDP, and compares a tiny HF Mixtral's logits, loss,
router losses and gradients with one process on the global batch. It also counts the step's
all-to-all bytes (``count_collectives``) against the routed theory.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from ep_support import (
    LOCAL_BATCH,
    SEQ,
    clone_for_ep,
    gather_objects,
    grad_errors,
    max_over_ranks,
    mean_over_ranks,
    tiny_mixtral,
)
from report import report
from torch.distributed.fsdp import fully_shard

from meshtrain.contract import parse_smp_parameters
from meshtrain_runtime.modules.moe import MoEConfig
from meshtrain_runtime.parallel.expert import (
    apply_expert_parallel,
    expert_parallel_modules,
    shard_experts_with_fsdp,
)
from meshtrain_runtime.parallel.expert_tp import tp_plan_without_experts
from meshtrain_runtime.parallel.tensor import apply_tensor_parallel
from meshtrain_runtime.state import build_state

HIDDEN, BYTES = 32, 4


def z_reference(router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat(router_logits).float().logsumexp(dim=-1).pow(2).mean()


def build(params: dict, top_k: int, config: MoEConfig):
    reference = tiny_mixtral(top_k)
    reference.router_aux_loss_coef = config.load_balancing_coeff
    model = clone_for_ep(reference)
    if params.pop("through_transform", False):  # the public path: init() then transform()
        import meshtrain_runtime as mr

        st = mr.init(params)
        return st, reference, mr.transform(model, moe_config=config)
    st = build_state(parse_smp_parameters(params), device=torch.device("cpu"))
    tp_mesh = st.mesh["tp"]
    apply_tensor_parallel(model, tp_mesh, plan=tp_plan_without_experts(model))
    apply_expert_parallel(model, st.expert_mesh, moe_config=config, tp_mesh=tp_mesh)
    hsdp = st.replicate_degree > 1
    shard_experts_with_fsdp(
        model, st.expert_mesh["replicate", "shard_mod_ep"] if hsdp else st.expert_mesh[
            "shard_mod_ep"])
    dp_mesh = st.mesh["replicate", "shard"] if hsdp else st.mesh["shard"]
    for block in model.model.layers:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return st, reference, model


def case(name: str, params: dict, top_k: int, config: MoEConfig) -> None:
    st, reference, model = build(params, top_k, config)
    dp, dp_rank = st.dp_size, st.dp_rank
    torch.manual_seed(1)
    tokens = torch.randint(0, 64, (dp * LOCAL_BATCH, SEQ))
    ref_out = reference(input_ids=tokens, labels=tokens, output_router_logits=True,
                        use_cache=False)
    z_ref = z_reference(ref_out.router_logits)
    ref_loss = ref_out.loss + config.moe_z_loss_coeff * z_ref
    ref_loss.backward()
    local = tokens[dp_rank * LOCAL_BATCH : (dp_rank + 1) * LOCAL_BATCH]
    out = model(input_ids=local, labels=local, output_router_logits=True, use_cache=False)
    out.loss.backward()
    errors = grad_errors(model, reference)
    modules = expert_parallel_modules(model)
    # Routed theory per rank: its tp share of the rows, k assignments each, per layer.
    start, stop = modules[0].token_split.bounds(LOCAL_BATCH * SEQ)
    sent = sum(sum(m.last_send_splits) for m in modules)
    remote = sum(sum(n for r, n in enumerate(m.last_send_splits) if r != m.ep_rank)
                 for m in modules)
    record = {
        "case": name,
        "degrees": {"tp": st.tensor_parallel_degree, "ep": st.expert_parallel_degree,
                    "replicate": st.replicate_degree, "shard": st.hybrid_shard_degree},
        "logits_err": max_over_ranks(
            (out.logits - ref_out.logits[dp_rank * LOCAL_BATCH : (dp_rank + 1) * LOCAL_BATCH])
            .abs().max().item()),
        "loss": mean_over_ranks(out.loss),
        "ref_loss": ref_loss.item(),
        "aux_err": max_over_ranks(abs(out.aux_loss.item() - ref_out.aux_loss.item())),
        "z_err": max_over_ranks(abs(out.z_loss.item() - z_ref.item())),
        "grad_err": max(errors.values()),
        "worst_grad": max(errors, key=errors.get),
        "groups": gather_objects(st.expert_group_ranks),
        "experts_held": gather_objects([m.first_expert for m in modules]),
        "rows_sent": gather_objects(sent),
        "rows_theory": gather_objects((stop - start) * top_k * len(modules)),
        "global_assignments": dp * LOCAL_BATCH * SEQ * top_k * len(modules),
        # bytes that cross ranks (dispatch + combine, forward), and those over the wire
        "remote_bytes": gather_objects(2 * remote * HIDDEN * BYTES),
    }
    if dist.get_rank() == 0:
        report(record)


def tp_split_experts_refused(name: str) -> None:
    """Experts split over tp (a tp_plan that shards them) with EP: a ConfigError. (The HF
    plan's own expert entries are kept replicated by meshtrain's TP, so this takes a split.)"""
    from torch import nn
    from torch.distributed.tensor import Shard, distribute_tensor

    from meshtrain.errors import ConfigError

    st = build_state(parse_smp_parameters({"tensor_parallel_degree": 2,
                                           "expert_parallel_degree": 2}),
                     device=torch.device("cpu"))
    model = tiny_mixtral(2)
    apply_tensor_parallel(model, st.mesh["tp"])  # the full HF plan (experts kept whole)
    experts = model.model.layers[0].mlp.experts
    split = distribute_tensor(experts.gate_up_proj.full_tensor().detach(), st.mesh["tp"],
                              [Shard(1)])
    experts.gate_up_proj = nn.Parameter(split)  # as a tp_plan splitting the experts would
    try:
        apply_expert_parallel(model, st.expert_mesh, tp_mesh=st.mesh["tp"])
        message = None
    except ConfigError as error:
        message = str(error)
    if dist.get_rank() == 0:
        report({"case": name, "message": message})


def main() -> None:
    config = MoEConfig(moe_aux_loss_coeff=0.05, moe_z_loss_coeff=0.01)
    case("tp2_ep2_fsdp_top2", {"tensor_parallel_degree": 2, "expert_parallel_degree": 2},
         top_k=2, config=config)
    case("tp2_ep2_hsdp_top1", {"tensor_parallel_degree": 2, "expert_parallel_degree": 2,
                               "hybrid_shard_degree": 1}, top_k=1, config=config)
    case("tp2_ep4_fsdp_top2", {"tensor_parallel_degree": 2, "expert_parallel_degree": 4},
         top_k=2, config=MoEConfig(moe_load_balancing="none", moe_z_loss_coeff=0.01))
    case("tp2_ep2_transform_top2", {"tensor_parallel_degree": 2, "expert_parallel_degree": 2,
                                    "through_transform": True}, top_k=2, config=config)
    tp_split_experts_refused("tp_split_experts")


if __name__ == "__main__":
    dist.init_process_group("gloo")
    {"four": main}[sys.argv[1]]()
