"""torchrun worker: ``init(params)`` + ``transform(model)`` on every parallel layout vs one process.

Usage (through tests/runtime/conftest.py's run_torchrun): ``integ_parity.py {2,4,8}``, with that
many ranks. Rank 0 reports one record per case (errors already maxed over ranks):

- parity cases: tiny HF Llama / GPT-NeoX with tensor parallelism (alone, under FSDP, with
  replicas, with sequence parallelism), tiny Mixtral with expert parallelism (top-1 / top-2,
  ep 2 and 4, with replicas); 3 AdamW steps with ``clip_grad_norm_`` against one process;
- checkpointing cases: the same layout with activation checkpointing / offloading from the
  parameters; gradients against the layout without them;
- delayed-init cases: meta-device models under TP and EP, materialised by transform;
- rank-0 weights (``load_state_dict_from_rank0``) under EP, and its ConfigError under TP.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import integ_support as support
import torch
import torch.distributed as dist
import tp_models
from report import report_cases
from torch.distributed.fsdp import FSDPModule

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime.modules.moe import MoEConfig
from meshtrain_runtime.parallel.activations import checkpointed_blocks, get_offload_stats

TP2 = {"tensor_parallel_degree": 2}
AC_VARIANTS = {
    "plain": {},
    "ac": {"activation_checkpointing": True},
    "ac_every2": {"activation_checkpointing": True, "activation_checkpointing_interval": 2},
    "selective": {"activation_checkpointing": "selective"},
    "selective_every2": {"activation_checkpointing": "selective",
                         "activation_checkpointing_interval": 2},
    "selective_offload": {"activation_checkpointing": "selective", "activation_offloading": True},
    "offload": {"activation_checkpointing": True, "activation_offloading": True,
                "activation_loading_horizon": 2},
    "offload_native": {"activation_checkpointing": True, "activation_offloading": True,
                       "sm_activation_offloading": False},
}
AC_LAYERS = 4

_REFERENCES: dict = {}


def parity(name: str, params: dict[str, Any], kind: str, **options: Any) -> dict[str, Any]:
    """One parity case; `options` go to the model builder (top_k) or transform.

    With an MoEConfig (``config=``, SMP's keyword) the reference uses its load-balancing
    coefficient while the model keeps HF's own (0.02): parity shows transform applied it.
    """
    build_options = {k: v for k, v in options.items() if k == "top_k"}
    transform_kwargs = {k: v for k, v in options.items() if k != "top_k"}
    build = partial(support.build_model, kind, **build_options)
    moe_config = transform_kwargs.get("config")
    adjust = None
    if moe_config is not None:
        def adjust(model: torch.nn.Module) -> None:
            model.router_aux_loss_coef = moe_config.load_balancing_coeff
    key = (kind, tuple(sorted(build_options.items())), repr(moe_config))
    result = support.run_case(params, build, references=_REFERENCES, key=key,
                              adjust_reference=adjust, **transform_kwargs)
    return {"case": name, "params": params, "kind": kind, **result}


def checkpointing(name: str, base: dict[str, Any]) -> dict[str, Any]:
    """Every AC variant of `base`: losses and first-step gradients against the plain variant."""
    runs: dict[str, dict[str, Any]] = {}
    stats: dict[str, Any] = {}
    for variant, keys in AC_VARIANTS.items():
        mr.reset()
        mr.init({**base, **keys})
        model = mr.transform(support.build_model("llama", layers=AC_LAYERS))
        runs[variant] = support.train_parallel(model, clip=False)
        offload = get_offload_stats(model)
        stats[variant] = {
            "checkpointed": len(checkpointed_blocks(model)),
            "blocks_offloaded": offload.blocks_offloaded if offload else 0,
            "max_resident_blocks": offload.max_resident_blocks if offload else 0,
        }
    reference = support.train_reference(support.build_model("llama", layers=AC_LAYERS),
                                        mr.state.dp_size, clip=False)
    plain = runs["plain"]
    variants = {}
    for variant, run in runs.items():
        same = all(torch.equal(g, plain["local_grads"][n]) for n, g in run["local_grads"].items())
        variants[variant] = {
            **stats[variant],
            "grads_bit_identical": support.all_ranks(same),
            "loss_diff_vs_plain": support.max_over_ranks(max(
                abs(a - b) for a, b in zip(run["losses"], plain["losses"], strict=True))),
            "loss_err_vs_single": support.max_over_ranks(max(
                abs(a - b) for a, b in zip(run["losses"], reference["losses"], strict=True))),
        }
    return {"case": name, "params": base, "variants": variants}


def delayed_tp(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A meta-device custom model (user tp_plan, random biases on the rowwise outputs)."""
    mr.reset()
    mr.init(params)
    with torch.device("meta"):
        model = tp_models.CustomLM()
    model = mr.transform(model, tp_plan=tp_models.CUSTOM_PLAN)
    attn = model.blocks[0].attn
    q_full = attn.q.weight.full_tensor()
    half = q_full.shape[0] // 2
    bias = attn.out.bias.to_local().detach().clone()  # Replicate over tp: must agree
    tp_group = mr.state.tp_process_group
    gathered = [torch.empty_like(bias) for _ in range(mr.state.tp_size)]
    dist.all_gather(gathered, bias, group=tp_group)
    loss = _custom_loss(model)
    loss.backward()
    return {
        "case": name,
        "params": params,
        "q_halves_differ": support.all_ranks(not torch.equal(q_full[:half], q_full[half:])),
        "q_std": q_full.std().item(),
        "tp_replicated_bias_agrees": support.all_ranks(all(torch.equal(g, bias)
                                                           for g in gathered)),
        "bias_nonzero": support.all_ranks(bool(bias.abs().sum() > 0)),
        "finite_loss": support.all_ranks(bool(torch.isfinite(loss.detach()).all())),
    }


def _custom_loss(model: torch.nn.Module) -> torch.Tensor:
    ids = support.local_rows(support.global_batch(mr.state.dp_size, 0)) % tp_models.VOCAB
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def delayed_ep(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A meta-device Mixtral under EP: HF init, then reset_parameters of the EP experts."""
    mr.reset()
    mr.init(params)
    model = mr.transform(support.build_model("mixtral", meta=True))
    layer = model.model.layers[0].mlp.experts
    experts = layer.gate_up_proj.full_tensor()
    distinct = all(not torch.equal(experts[i], experts[j])
                   for i in range(len(experts)) for j in range(i))
    loss = support.causal_lm_loss(model, support.local_rows(
        support.global_batch(mr.state.dp_size, 0)))
    loss.backward()
    return {
        "case": name,
        "params": params,
        "experts_distinct": support.all_ranks(distinct),
        "expert_std": experts.std().item(),
        "init_std": model.config.initializer_range,
        "expert_layer": type(layer).__name__,
        "finite_loss": support.all_ranks(bool(torch.isfinite(loss.detach()).all())),
        "expert_grad_finite": support.all_ranks(
            bool(torch.isfinite(layer.gate_up_proj.grad.to_local()).all())),
    }


def rank0_weights(name: str, params: dict[str, Any], kind: str) -> dict[str, Any]:
    """load_state_dict_from_rank0: rank 0 holds the weights, the others a meta model."""
    mr.reset()
    mr.init(params)
    reference = support.build_model(kind)
    model = reference if mr.state.rank == 0 else support.build_model(kind, meta=True)
    try:
        model = mr.transform(copy.deepcopy(model), load_state_dict_from_rank0=True)
    except ConfigError as error:
        return {"case": name, "params": params, "config_error": str(error)}
    errors = [(support.full(p.detach()) - dict(reference.named_parameters())[n]).abs().max()
              .item() for n, p in model.named_parameters()]
    return {"case": name, "params": params, "param_err": support.max_over_ranks(max(errors)),
            "fsdp": isinstance(model, FSDPModule)}


CaseFn = Callable[[], dict[str, Any]]


def cases_for(world: int) -> list[tuple[str, CaseFn]]:
    ep_config = MoEConfig(moe_aux_loss_coeff=0.05, moe_z_loss_coeff=0.0)
    cases: dict[int, list[tuple[str, CaseFn]]] = {
        2: [
            ("llama_tp2", partial(parity, "llama_tp2", {**TP2, "random_seed": 7}, "llama")),
            ("llama_tp2_sp", partial(parity, "llama_tp2_sp", {**TP2, "sequence_parallel": True},
                                     "llama")),
            ("neox_tp2", partial(parity, "neox_tp2", TP2, "neox")),
            ("llama_tp2_bf16", partial(parity, "llama_tp2_bf16",
                                       {**TP2, "mixed_precision": "bf16"}, "llama")),
            ("ac_tp2", partial(checkpointing, "ac_tp2", TP2)),
            ("delayed_tp2", partial(delayed_tp, "delayed_tp2", TP2)),
            ("rank0_tp2", partial(rank0_weights, "rank0_tp2", TP2, "llama")),
        ],
        4: [
            ("llama_tp2_hsd2", partial(parity, "llama_tp2_hsd2",
                                       {**TP2, "hybrid_shard_degree": 2}, "llama")),
            ("llama_tp2_hsd2_sp", partial(parity, "llama_tp2_hsd2_sp",
                                          {**TP2, "hybrid_shard_degree": 2,
                                           "sequence_parallel": True}, "llama")),
            ("llama_tp2_noshard_sp", partial(
                parity, "llama_tp2_noshard_sp",
                {**TP2, "hybrid_shard_degree": 1, "sequence_parallel": True}, "llama")),
            ("mixtral_ep2_top1", partial(parity, "mixtral_ep2_top1",
                                         {"expert_parallel_degree": 2}, "mixtral", top_k=1)),
            ("mixtral_ep2_top2_config", partial(
                parity, "mixtral_ep2_top2_config", {"expert_parallel_degree": 2}, "mixtral",
                top_k=2, config=ep_config)),
            ("mixtral_ep4_top2", partial(parity, "mixtral_ep4_top2",
                                         {"expert_parallel_degree": 4}, "mixtral", top_k=2)),
            ("mixtral_ep2_hsd2_top2", partial(
                parity, "mixtral_ep2_hsd2_top2",
                {"expert_parallel_degree": 2, "hybrid_shard_degree": 2}, "mixtral", top_k=2)),
            ("mixtral_ep2_top2_ac", partial(
                parity, "mixtral_ep2_top2_ac",
                {"expert_parallel_degree": 2, "activation_checkpointing": True}, "mixtral",
                top_k=2)),
            ("mixtral_ep2_top2_selective", partial(
                parity, "mixtral_ep2_top2_selective",
                {"expert_parallel_degree": 2, "activation_checkpointing": "selective"},
                "mixtral", top_k=2)),
            ("llama_tp2_hsd2_sp_offload", partial(
                parity, "llama_tp2_hsd2_sp_offload",
                {**TP2, "hybrid_shard_degree": 2, "sequence_parallel": True,
                 "activation_checkpointing": True, "activation_offloading": True}, "llama")),
            ("ac_hsd2", partial(checkpointing, "ac_hsd2", {"hybrid_shard_degree": 2})),
            ("delayed_tp2_hsd2", partial(delayed_tp, "delayed_tp2_hsd2",
                                         {**TP2, "hybrid_shard_degree": 2})),
            ("delayed_ep2", partial(delayed_ep, "delayed_ep2", {"expert_parallel_degree": 2})),
            ("rank0_ep2", partial(rank0_weights, "rank0_ep2", {"expert_parallel_degree": 2},
                                  "mixtral")),
        ],
        8: [
            ("llama_tp2_hsd2_rep2", partial(parity, "llama_tp2_hsd2_rep2",
                                            {**TP2, "hybrid_shard_degree": 2}, "llama")),
            ("llama_tp2_hsd2_rep2_sp", partial(parity, "llama_tp2_hsd2_rep2_sp",
                                               {**TP2, "hybrid_shard_degree": 2,
                                                "sequence_parallel": True}, "llama")),
        ],
    }
    return cases[world]


def main() -> None:
    # full_tensor() of (shard, tp) gradients warns about sequential all-reduces: expected here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    world = int(sys.argv[1])
    dist.init_process_group("gloo")
    report_cases(cases_for(world))
    mr.reset()


if __name__ == "__main__":
    main()
