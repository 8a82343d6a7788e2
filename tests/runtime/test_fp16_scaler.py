"""`mixed_precision: fp16` with `meshtrain_runtime.grad.grad_scaler()`, 2 gloo ranks, full shard.

One torchrun launch runs this file as its own worker (``__main__`` below). The loss is scaled by
LOSS_FACTOR = 1e-5, as a sum-loss divided by a large global token count would be: the true
gradients are then mostly below fp16's smallest subnormal (6e-8), so the fp16 backward flushes
them to zero. CPU supports fp16 matmuls, so this is the same code path as on GPU: FSDP2 casts
parameters to fp16, backward runs in fp16, gradients reduce in fp32.

Checked: (1) unscaled fp16 has many more exact-zero gradient entries than fp32 (whose only
zeros are embedding rows of tokens absent from the batch); (2) with the scaler the zero count
is back to fp32's (within 0.1 % of the entries) and every gradient is within fp16's rounding of
the fp32 one (relative 1e-2 of the largest entry per tensor: fp16 has an 11-bit mantissa and
the backward sums a few hundred products); the clipped norm agrees within 1e-2 relative;
(3) an inf on ONE rank's shard makes BOTH ranks skip the step and halve the scale (DTensor
all-reduces the found-inf flag); (4) the scaler is a pass-through when bf16 is asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).resolve()
LOSS_FACTOR = 1e-5
REL_TOL = 1e-2


@pytest.fixture(scope="module")
def records(torchrun: Any) -> dict[int, dict[str, Any]]:
    out = torchrun(WORKER, 2, timeout=300)
    print(out[0])  # the measured figures, for docs/hsdp.md (pytest -s)
    return {r["rank"]: r for r in out}


@pytest.mark.multiprocess
def test_unscaled_fp16_gradients_underflow(records: dict[int, dict[str, Any]]) -> None:
    r = records[0]
    # fp32's zeros are structural (embedding rows of tokens absent from the batch); fp16 adds
    # the underflowed ones.
    assert r["fp32_zeros"] < 0.05 * r["numel"]
    assert r["fp16_zeros"] - r["fp32_zeros"] > 0.3 * r["numel"], r


@pytest.mark.multiprocess
def test_scaler_recovers_them(records: dict[int, dict[str, Any]]) -> None:
    r = records[0]
    # A handful of true gradients are below 6e-8 / 2**16 even after scaling (measured: 3 of
    # 22,688); everything else comes back.
    assert r["scaled_zeros"] - r["fp32_zeros"] <= 1e-3 * r["numel"], r
    assert r["scaled_max_rel_error"] < REL_TOL
    assert abs(r["scaled_norm"] - r["fp32_norm"]) < REL_TOL * r["fp32_norm"]
    assert r["step_taken"] and r["scale_after_good_step"] == 2.0**16


@pytest.mark.multiprocess
def test_inf_on_one_rank_skips_the_step_everywhere(records: dict[int, dict[str, Any]]) -> None:
    for rank in (0, 1):
        assert records[rank]["inf_step_params_unchanged"], rank
        assert records[rank]["scale_after_inf"] == 2.0**15, rank


@pytest.mark.multiprocess
def test_scaler_is_pass_through_for_bf16(records: dict[int, dict[str, Any]]) -> None:
    assert records[0]["bf16_enabled"] is False
    assert records[0]["fp16_enabled"] is True


# ------------------------------------------------------------------ worker (on each rank)

def _build():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=16))


def _fresh(params: dict[str, Any]):
    import meshtrain_runtime as mr

    mr.reset()
    mr.init(params)
    return mr.transform(_build())


def _loss(model):
    import torch

    import meshtrain_runtime as mr

    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(mr.state.dp_rank))
    return model(input_ids=ids, labels=ids, use_cache=False).loss * LOSS_FACTOR


def _grads(model) -> dict[str, Any]:
    return {n: p.grad.full_tensor().float() for n, p in model.named_parameters()}


def _zeros(grads: dict[str, Any]) -> int:
    return int(sum((g == 0).sum() for g in grads.values()))


def _max_rel_error(grads: dict[str, Any], reference: dict[str, Any]) -> float:
    return max(float((grads[n] - ref).abs().max() / ref.abs().max())
               for n, ref in reference.items())


def _scaled_case(reference: dict[str, Any]) -> dict[str, Any]:
    import torch

    import meshtrain_runtime as mr
    from meshtrain_runtime.grad import grad_scaler

    model = _fresh({"mixed_precision": "fp16"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = grad_scaler()
    scaler.scale(_loss(model)).backward()
    scaler.unscale_(optimizer)
    grads = _grads(model)
    norm = float(mr.clip_grad_norm_(model, 1e9))
    before = [p.to_local().clone() for p in model.parameters()]
    scaler.step(optimizer)
    scaler.update()
    changed = any(not torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters(),
                                                                    strict=True))
    out = {"scaled_zeros": _zeros(grads), "scaled_max_rel_error": _max_rel_error(grads, reference),
           "scaled_norm": norm, "step_taken": changed, "scale_after_good_step": scaler.get_scale(),
           "fp16_enabled": scaler.is_enabled()}
    return {**out, **_inf_case(model, optimizer, scaler)}


def _inf_case(model, optimizer, scaler) -> dict[str, Any]:
    import torch

    import meshtrain_runtime as mr

    optimizer.zero_grad()
    scaler.scale(_loss(model)).backward()
    if mr.state.rank == 1:  # an overflow on one rank's shard only
        next(iter(model.parameters())).grad.to_local().view(-1)[0] = float("inf")
    before = [p.to_local().clone() for p in model.parameters()]
    scaler.step(optimizer)
    scaler.update()
    unchanged = all(torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters(),
                                                                 strict=True))
    return {"inf_step_params_unchanged": unchanged, "scale_after_inf": scaler.get_scale()}


def main() -> None:
    sys.path.insert(0, str(WORKER.parent / "workers"))
    from report import report

    import meshtrain_runtime as mr
    from meshtrain_runtime.grad import grad_scaler

    model = _fresh({})
    _loss(model).backward()
    reference = _grads(model)
    out: dict[str, Any] = {"fp32_zeros": _zeros(reference),
                           "numel": int(sum(g.numel() for g in reference.values())),
                           "fp32_norm": float(mr.clip_grad_norm_(model, 1e9))}
    model = _fresh({"mixed_precision": "fp16"})
    _loss(model).backward()
    out["fp16_zeros"] = _zeros(_grads(model))
    out.update(_scaled_case(reference))
    mr.reset()
    mr.init({"mixed_precision": "bf16"})
    out["bf16_enabled"] = grad_scaler().is_enabled()
    report(out)


if __name__ == "__main__":
    main()
