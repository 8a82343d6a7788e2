"""Checks run inside the 2-rank tp_parity launch: collectives, random seeds, bad input.

Each function returns JSON-able facts; tests/runtime/test_tensor_parallel_multiprocess.py
asserts on them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
import torch.distributed as dist
import tp_models as models
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import loss_parallel

from meshtrain.errors import ConfigError
from meshtrain_runtime.diagnostics.collectives import count_collectives
from meshtrain_runtime.parallel.tensor import apply_tensor_parallel, region_seed

SEED = 1234


def run_all(tp_mesh: DeviceMesh) -> dict:
    return {
        "collectives": collectives(tp_mesh),
        "rng_region": rng_region(tp_mesh),
        "rng_replicated_stream": rng_replicated_stream(tp_mesh),
        "rng_checkpoint_recompute": rng_checkpoint_recompute(tp_mesh),
        "bad_input": bad_input(tp_mesh),
        "hf_inputs": hf_inputs(tp_mesh),
    }


def collectives(tp_mesh: DeviceMesh) -> dict:
    """Collectives of one forward+backward of tiny Llama per (sp, lp) layout."""
    base = models.build_model("llama")
    ids = models.global_batch(1, 0)
    report = {}
    for sp, lp in ((False, False), (False, True), (True, False), (True, True)):
        model = apply_tensor_parallel(copy.deepcopy(base), tp_mesh, sequence_parallel=sp,
                                      loss_parallel=lp)

        def step(model=model, lp=lp) -> None:
            models.backward(models.causal_lm_loss(model, ids, lp), lp)

        stats = count_collectives(step)
        report[f"sp={int(sp)},lp={int(lp)}"] = {
            f"{phase}/{op}": [count, stats.payload_bytes[(phase, op)]]
            for (phase, op), count in stats.counts.items()
        }
    report["shape"] = {"batch": ids.shape[0], "seq": ids.shape[1],
                       "hidden": base.config.hidden_size, "vocab": base.config.vocab_size,
                       "layers": base.config.num_hidden_layers}
    return report


def _capture(module: torch.nn.Module) -> list[torch.Tensor]:
    """Record the dropped positions (output 0 where the input was not) of a Dropout."""
    masks: list[torch.Tensor] = []

    def hook(_m: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        masks.append(((output == 0) & (args[0] != 0)).detach().clone())

    module.register_forward_hook(hook)
    return masks


def _gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def rng_region(tp_mesh: DeviceMesh) -> dict:
    """Attention dropout inside the region: seed + tp_rank streams, new per forward."""
    model = models.CustomLM(dropout=0.5)
    apply_tensor_parallel(model, tp_mesh, plan=models.CUSTOM_PLAN, random_seed=SEED)
    model.train()
    masks = _capture(model.blocks[0].attn.attn_drop)
    ids = models.global_batch(1, 0)
    for _ in range(2):
        model(ids)
    region_index = model.meshtrain_tp.regions.index("blocks.0.attn")
    tp_rank = tp_mesh.get_local_rank()
    expected = []
    for forward_index in range(2):
        torch.manual_seed(region_seed(SEED, tp_rank, region_index, forward_index))
        dropped = torch.nn.functional.dropout(torch.ones(masks[0].shape), 0.5) == 0
        expected.append(dropped)
    causal = torch.ones(masks[0].shape[-2:], dtype=torch.bool).tril()
    gathered = _gather(masks[0].to(torch.uint8))
    return {
        "matches_seed_plus_tp_rank": all(
            torch.equal(mask, want & causal) for mask, want in zip(masks, expected, strict=True)
        ),
        "differs_across_tp_ranks": not torch.equal(gathered[0], gathered[1]),
        "differs_across_forwards": not torch.equal(masks[0], masks[1]),
        "dropped_fraction": float(masks[0].sum() / (causal.sum() * masks[0].shape[0]
                                                    * masks[0].shape[1])),
    }


def rng_replicated_stream(tp_mesh: DeviceMesh) -> dict:
    """Dropout on the replicated residual stream matches the non-TP run with the same seed."""
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return models.CustomLM(dropout=0.0, resid_dropout=0.3)

    reference, model = build(), build()
    apply_tensor_parallel(model, tp_mesh, plan=models.CUSTOM_PLAN, random_seed=SEED)
    ids = models.global_batch(1, 0)
    results = []
    for candidate in (reference, model):
        candidate.train()
        masks = _capture(candidate.blocks[1].resid_drop)
        torch.manual_seed(11)
        loss = models.causal_lm_loss(candidate, ids, False)
        results.append((float(loss), masks[0]))
    gathered = _gather(results[1][1].to(torch.uint8))
    return {
        "loss_error_vs_single_process": abs(results[0][0] - results[1][0]),
        "mask_equals_single_process": torch.equal(results[0][1], results[1][1]),
        "same_mask_on_tp_ranks": torch.equal(gathered[0], gathered[1]),
    }


def rng_checkpoint_recompute(tp_mesh: DeviceMesh) -> dict:
    """Activation checkpointing replays the region's dropout masks: identical gradients."""
    grads = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model = models.CustomLM(dropout=0.5, checkpoint=checkpoint)
        apply_tensor_parallel(model, tp_mesh, plan=models.CUSTOM_PLAN, random_seed=SEED)
        model.train()
        models.causal_lm_loss(model, models.global_batch(1, 0), False).backward()
        grads.append({n: p.grad.to_local().clone() for n, p in model.named_parameters()})
    error = max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0])
    return {"max_grad_error": error}


def _config_error(build: Callable[[], torch.nn.Module], **kwargs: object) -> str:
    try:
        apply_tensor_parallel(build(), **kwargs)  # type: ignore[arg-type]
    except ConfigError as error:
        return str(error)
    return "no error"


def _forward_error(build: Callable[[], torch.nn.Module], tp_mesh: DeviceMesh,
                   plan: dict[str, str]) -> str:
    """The ConfigError of the first forward (a norm between colwise and rowwise projections
    looks, by its names, like a norm before them; only the data flow tells them apart)."""
    model = apply_tensor_parallel(build(), tp_mesh, plan=plan)
    try:
        model(torch.zeros(1, models.SEQ, dtype=torch.long))
    except ConfigError as error:
        return str(error)
    return "no error"


def bad_input(tp_mesh: DeviceMesh) -> dict:
    """apply_tensor_parallel's ConfigErrors on a real 2-rank mesh."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama_one_kv_head() -> torch.nn.Module:
        return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=4,
                                            num_key_value_heads=1, vocab_size=64))

    def custom_three_heads() -> torch.nn.Module:
        return models.CustomLM(dim=48, num_heads=3)

    no_embedding = {k: v for k, v in models.CUSTOM_PLAN.items() if k != "embed"}
    no_v = {k: v for k, v in models.CUSTOM_PLAN.items() if k != "blocks.*.attn.v"}
    return {
        "kv_heads": _config_error(llama_one_kv_head, tp_mesh=tp_mesh),
        "custom_heads": _config_error(custom_three_heads, tp_mesh=tp_mesh,
                                      plan=models.CUSTOM_PLAN),
        "no_plan": _config_error(models.CustomLM, tp_mesh=tp_mesh),
        "sp_without_embedding": _config_error(models.CustomLM, tp_mesh=tp_mesh,
                                              plan=no_embedding, sequence_parallel=True),
        "missing_projection": _config_error(models.CustomLM, tp_mesh=tp_mesh, plan=no_v),
        "plain_no_plan": _config_error(models.PlainLM, tp_mesh=tp_mesh),
        "plain_norm_between": _forward_error(
            lambda: models.PlainLM(norm_between=True), tp_mesh, models.PLAIN_MIN_PLAN
        ),
        "mixtral_sp": _config_error(lambda: models.build_model("mixtral"), tp_mesh=tp_mesh,
                                    sequence_parallel=True),
    }


def hf_inputs(tp_mesh: DeviceMesh) -> dict:
    """What HF training loops pass: padding masks, uneven lengths, labels with -100, a vocab
    the degree does not divide. Errors vs the unsplit model (forward loss)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=95))
    ids = torch.randint(0, 95, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    reference = float(base(input_ids=ids, attention_mask=mask, labels=labels).loss)
    errors = {}
    for sp, lp in ((False, False), (True, False), (True, True)):
        model = apply_tensor_parallel(copy.deepcopy(base), tp_mesh, sequence_parallel=sp,
                                      loss_parallel=lp)
        with loss_parallel() if lp else contextlib.nullcontext():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        value = loss.full_tensor() if lp else loss
        errors[f"sp={int(sp)},lp={int(lp)}"] = abs(float(value) - reference)
    return errors

