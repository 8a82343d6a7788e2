"""torchrun worker: expert parallelism against a single process, many cases in one launch.

Usage: ep_parity.py {two,four}. Reports one record per case (from rank 0, errors already
maxed over ranks) plus one accounting record per rank and case.
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch.distributed as dist
from ep_support import (
    LOCAL_BATCH,
    LR,
    SEQ,
    Layout,
    MoENet,
    build_meshes,
    clone_for_ep,
    ep_apply,
    expert_accounting,
    gather_objects,
    global_expert_load,
    global_tokens,
    grad_errors,
    local_rows,
    max_over_ranks,
    mean_over_ranks,
    moe_net_loss,
    param_errors,
    shard_model,
    tiny_mixtral,
)
from report import report
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    apply_activation_checkpointing,
)

from meshtrain_runtime.modules.moe import MoE, MoEConfig, router_losses


def z_reference(router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """ST-MoE z-loss pooled over layers, written out independently of meshtrain."""
    return torch.cat(router_logits).float().logsumexp(dim=-1).pow(2).mean()


def mixtral_case(name: str, layout: Layout, top_k: int, *, starve: bool = False,
                 moe_config: MoEConfig | None = None, checkpoint: bool = False) -> None:
    reference = tiny_mixtral(top_k)
    if moe_config is not None:
        reference.router_aux_loss_coef = moe_config.load_balancing_coeff
    model = clone_for_ep(reference)
    main, expert = build_meshes(layout)
    ep_apply(model, expert, moe_config)
    accounting = {"after_ep": gather_objects(
        expert_accounting(model, reference, layout, fsdp_applied=False))}
    if checkpoint:  # the transform's order: EP, then activation checkpointing, then FSDP
        apply_activation_checkpointing(model, check_fn=lambda m: m in set(model.model.layers))
    if layout.fsdp:
        shard_model(model, layout, main, expert, list(model.model.layers))
        accounting["after_fsdp"] = gather_objects(
            expert_accounting(model, reference, layout, fsdp_applied=True))
    tokens = global_tokens(layout, starve=starve)
    ref_out = reference(input_ids=tokens, labels=tokens, output_router_logits=True,
                        use_cache=False)
    z_ref = z_reference(ref_out.router_logits)
    ref_loss = ref_out.loss + (moe_config.moe_z_loss_coeff * z_ref if moe_config else 0.0)
    ref_loss.backward()
    local = local_rows(tokens, layout)
    out = model(input_ids=local, labels=local, output_router_logits=True, use_cache=False)
    out.loss.backward()
    if not layout.fsdp:
        from ep_support import average_plain_grads

        average_plain_grads(model, layout)
    errors = grad_errors(model, reference)
    record = {
        "case": name,
        "layout": layout.__dict__,
        "top_k": top_k,
        "logits_err": max_over_ranks(
            (out.logits - local_rows(ref_out.logits, layout)).abs().max().item()
        ),
        "loss": mean_over_ranks(out.loss),
        "ref_loss": ref_loss.item(),
        "aux_err": max_over_ranks(abs(out.aux_loss.item() - ref_out.aux_loss.item())),
        "aux": out.aux_loss.item(),
        "z_err": max_over_ranks(abs(out.z_loss.item() - z_ref.item())),
        "grad_err": max(errors.values()),
        "worst_grad": max(errors, key=errors.get),
        "expert_load": global_expert_load(model),
        "checkpointed_blocks": sum(isinstance(m, CheckpointWrapper) for m in model.modules()),
    }
    record["step2_loss_err"], record["param_err"] = second_step(model, reference, layout)
    if dist.get_rank() == 0:
        report({**record, "accounting": accounting})


def second_step(model, reference, layout: Layout) -> tuple[float, float]:
    """One SGD step on both, then compare parameters and the next loss (training stays equal)."""
    for module in (model, reference):
        with torch.no_grad():
            for param in module.parameters():
                param -= LR * param.grad
                param.grad = None
    tokens = global_tokens(layout, seed=2)
    ref_loss = reference(input_ids=tokens, labels=tokens, use_cache=False).loss
    local = local_rows(tokens, layout)
    loss = mean_over_ranks(model(input_ids=local, labels=local, use_cache=False).loss)
    return abs(loss - ref_loss.item()), param_errors(model, reference)


def sinkhorn_case(name: str, layout: Layout, top_k: int) -> None:
    """Sinkhorn routing (SMP's default balancing) under EP + FSDP against one process that
    replays each rank's own token set: Sinkhorn normalises over a rank's tokens, so the
    reference runs one forward per rank's rows and averages (equal rows, no padding)."""
    from meshtrain_runtime.modules.moe_routing import install_hf_routing, sinkhorn

    config = MoEConfig(moe_load_balancing="sinkhorn", moe_z_loss_coeff=0.01)
    reference = tiny_mixtral(top_k)
    reference.router_aux_loss_coef = config.load_balancing_coeff  # 0: no LB loss added
    model = clone_for_ep(reference)
    install_hf_routing([layer.mlp.gate for layer in reference.model.layers], "sinkhorn")
    main, expert = build_meshes(layout)
    ep_apply(model, expert, config)
    shard_model(model, layout, main, expert, list(model.model.layers))
    tokens = global_tokens(layout)
    per_rank = tokens.shape[0] // layout.dp
    ref_losses, ref_logits, choice_differs = [], [], False
    for rows in tokens.split(per_rank):
        out = reference(input_ids=rows, labels=rows, output_router_logits=True, use_cache=False)
        ref_losses.append(out.loss + config.moe_z_loss_coeff * z_reference(out.router_logits))
        ref_logits.append(out.logits)
        logits0 = out.router_logits[0].detach()
        choice_differs |= not torch.equal(torch.topk(sinkhorn(logits0), top_k).indices,
                                          torch.topk(logits0, top_k).indices)
    ref_loss = torch.stack(ref_losses).mean()
    ref_loss.backward()
    local = local_rows(tokens, layout)
    out = model(input_ids=local, labels=local, output_router_logits=True, use_cache=False)
    out.loss.backward()
    errors = grad_errors(model, reference)
    record = {
        "case": name,
        "layout": layout.__dict__,
        "logits_err": max_over_ranks(
            (out.logits - local_rows(torch.cat(ref_logits), layout)).abs().max().item()),
        "loss": mean_over_ranks(out.loss),
        "ref_loss": ref_loss.item(),
        "grad_err": max(errors.values()),
        "worst_grad": max(errors, key=errors.get),
        "sinkhorn_changes_choice": choice_differs,
    }
    if dist.get_rank() == 0:
        report(record)


def moe_layer_case(name: str, layout: Layout) -> None:
    """meshtrain MoE layers in a custom model, FSDP over shard_mod_ep (hidden 9: the
    down_proj's dim 1 does not divide by 2, so it falls back to dim 0)."""
    config = MoEConfig(moe_aux_loss_coeff=0.05, moe_z_loss_coeff=0.01, random_seed=7)
    reference = MoENet(config)
    model = clone_for_ep(reference)
    main, expert = build_meshes(layout)
    ep_apply(model, expert, None)
    accounting = {"after_ep": gather_objects(
        expert_accounting(model, reference, layout, fsdp_applied=False))}
    if layout.fsdp:
        shard_model(model, layout, main, expert, [model.moe1, model.moe2])
        accounting["after_fsdp"] = gather_objects(
            expert_accounting(model, reference, layout, fsdp_applied=True))
    torch.manual_seed(3)
    x = torch.randn(layout.dp * LOCAL_BATCH, SEQ, 9)
    y = torch.randn(layout.dp * LOCAL_BATCH, SEQ, 3)
    ref_loss = moe_net_loss(reference, x, y)
    ref_loss.backward()
    loss = moe_net_loss(model, local_rows(x, layout), local_rows(y, layout))
    loss.backward()
    errors = grad_errors(model, reference)
    lb_err = max(
        abs(getattr(model, m).load_balancing_loss.item()
            - getattr(reference, m).load_balancing_loss.item())
        for m in ("moe1", "moe2")
    )
    record = {
        "case": name,
        "layout": layout.__dict__,
        "loss": mean_over_ranks(loss),
        "ref_loss": ref_loss.item(),
        "lb_err": max_over_ranks(lb_err),
        "z_err": max_over_ranks(abs(model.moe1.z_loss.item() - reference.moe1.z_loss.item())),
        "grad_err": max(errors.values()),
        "worst_grad": max(errors, key=errors.get),
        "placements": [str(p.placements) for p in model.moe1.experts.parameters()],
        "expert_load": global_expert_load(model),
    }
    if dist.get_rank() == 0:
        report({**record, "accounting": accounting})


def masked_aux_case(name: str, layout: Layout) -> None:
    """router_losses with an attention mask over the EP group equals HF on the global batch."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    torch.manual_seed(5)
    logits = tuple(torch.randn(layout.dp * LOCAL_BATCH * SEQ, 4) for _ in range(2))
    mask = (torch.rand(layout.dp * LOCAL_BATCH, SEQ) > 0.3).long()
    expected = load_balancing_loss_func(logits, 4, 2, mask)
    rows = LOCAL_BATCH * SEQ
    rank = dist.get_rank()
    mine = tuple(lg[rank * rows : (rank + 1) * rows] for lg in logits)
    got, _ = router_losses(mine, 4, 2, local_rows(mask, layout), group=dist.group.WORLD)
    local_only, _ = router_losses(mine, 4, 2, local_rows(mask, layout))
    if rank == 0:
        report({"case": name, "err": abs(got.item() - expected.item()),
                "local_differs": abs(local_only.item() - expected.item())})


def bad_input_cases() -> None:
    """Each mistake -> ConfigError; report the messages."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from transformers import LlamaConfig, LlamaForCausalLM

    from meshtrain.errors import ConfigError
    from meshtrain_runtime.parallel.expert import apply_expert_parallel, shard_experts_with_fsdp

    mesh = init_device_mesh("cpu", (1, 1, 2), mesh_dim_names=("replicate", "shard_mod_ep", "ep"))
    flat = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    tp_model = tiny_mixtral(2)
    parallelize_module(tp_model.model.layers[0].self_attn, flat, {"q_proj": ColwiseParallel()})
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, vocab_size=32))
    applied = apply_expert_parallel(tiny_mixtral(2), mesh)
    attempts = {
        "indivisible": lambda: apply_expert_parallel(tiny_mixtral(2, num_experts=3), mesh),
        "no_moe": lambda: apply_expert_parallel(llama, mesh),
        "tensor_parallel": lambda: apply_expert_parallel(tp_model, mesh),
        "no_ep_axis": lambda: apply_expert_parallel(tiny_mixtral(2), mesh["replicate",
                                                                          "shard_mod_ep"]),
        "twice": lambda: apply_expert_parallel(applied, mesh),
        "fsdp_before_ep": lambda: shard_experts_with_fsdp(tiny_mixtral(2), mesh["shard_mod_ep"]),
        "fsdp_over_ep_axis": lambda: shard_experts_with_fsdp(applied, mesh["ep"]),
        "moe_top_k": lambda: MoE(8, 8, num_experts=2, top_k=3),
    }
    results = {}
    for key, attempt in attempts.items():
        try:
            attempt()
            results[key] = {"raised": None}
        except ConfigError as error:
            results[key] = {"raised": "ConfigError", "message": str(error)}
        except Exception as error:
            results[key] = {"raised": type(error).__name__, "message": str(error),
                            "trace": traceback.format_exc()[-800:]}
    if dist.get_rank() == 0:
        report({"case": "bad_input", "results": results})


def reset_case(name: str, layout: Layout) -> None:
    """ExpertParallelExperts.reset_parameters (delayed init) draws N(0, initializer_range)."""
    from meshtrain_runtime.parallel.expert import expert_parallel_modules

    model = tiny_mixtral(2)
    model.config.initializer_range = 0.05
    _, expert = build_meshes(layout)
    ep_apply(model, expert, None)
    stds, changed = [], []
    for module in expert_parallel_modules(model):
        before = module.down_proj.to_local().clone()
        module.reset_parameters()
        changed.append(not torch.equal(before, module.down_proj.to_local()))
        stds += [module.gate_up_proj.to_local().std().item(),
                 module.down_proj.to_local().std().item()]
    rows = gather_objects({"init_std": [m.init_std for m in expert_parallel_modules(model)],
                           "stds": stds, "changed": changed})
    if dist.get_rank() == 0:
        report({"case": name, "ranks": rows})


def empty_weights_case(name: str, layout: Layout) -> None:
    """AWS's SMP scripts transform an MoE model under accelerate's init_empty_weights, which
    patches register_parameter; EP must still install its DTensor slices (on meta)."""
    from accelerate import init_empty_weights

    from meshtrain_runtime.parallel.expert import expert_parallel_modules

    _, expert = build_meshes(layout)
    with init_empty_weights():
        model = tiny_mixtral(2)
        ep_apply(model, expert, MoEConfig(moe_load_balancing="sinkhorn"))
    modules = expert_parallel_modules(model)
    if dist.get_rank() == 0:
        report({"case": name, "layers": len(modules),
                "meta": all(m.gate_up_proj.to_local().is_meta for m in modules),
                "local_experts": [m.gate_up_proj.to_local().shape[0] for m in modules]})


def run_two() -> None:
    mixtral_case("ep2_of_2_top2_plain_starved", Layout(1, 2, 2, fsdp=False), top_k=2,
                 starve=True)
    mixtral_case("ep2_of_2_top1_fsdp_checkpointed", Layout(1, 2, 2), top_k=1,
                 moe_config=MoEConfig(moe_aux_loss_coeff=0.05, moe_z_loss_coeff=0.01),
                 checkpoint=True)
    sinkhorn_case("sinkhorn_ep2_of_2_top2_fsdp", Layout(1, 2, 2), top_k=2)
    masked_aux_case("masked_aux_2", Layout(1, 2, 2))
    reset_case("reset_2", Layout(1, 2, 2))
    empty_weights_case("empty_weights_2", Layout(1, 2, 2))
    bad_input_cases()


def run_four() -> None:
    mixtral_case("ep2_of_4_top2_fsdp", Layout(1, 4, 2), top_k=2)
    mixtral_case("ep4_of_4_top1_fsdp_starved", Layout(1, 4, 4), top_k=1, starve=True)
    mixtral_case("ep4_of_4_top2_fsdp", Layout(1, 4, 4), top_k=2,
                 moe_config=MoEConfig(moe_load_balancing="none", moe_z_loss_coeff=0.01))
    mixtral_case("ep2_hsdp_2x2_top1", Layout(2, 2, 2), top_k=1)
    moe_layer_case("moe_layer_ep2_of_4_fsdp", Layout(1, 4, 2))


if __name__ == "__main__":
    dist.init_process_group("gloo")
    {"two": run_two, "four": run_four}[sys.argv[1]]()
