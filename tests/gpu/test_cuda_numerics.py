"""Low-precision and expert kernels on one GPU: the fp16 loss scaler, float8 linears and the
grouped expert matmuls, each against a higher-precision reference.

Multi-rank paths (NCCL collectives, float8 all-gather under sharding, tensor / expert parallel
all-to-alls) need two GPUs or more: NCCL refuses two ranks on one device. gpu_check.py reports
them as "needs >= 2 GPUs"; no test here pretends to cover them.
"""

from __future__ import annotations

import pytest
import torch
from gpu_models import token_ids, train, whole

pytestmark = pytest.mark.gpu

LOSS_FACTOR = 1e-5  # a sum-loss over many tokens: fp16 gradients would mostly flush to zero


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: whole(p.grad).float().cpu() for n, p in model.named_parameters()}


def _zeros(grads: dict[str, torch.Tensor]) -> int:
    return int(sum((g == 0).sum() for g in grads.values()))


def _l2_gaps(grads, reference) -> dict[str, float]:
    """Per tensor, |grad - reference| / |reference| in L2."""
    return {name: float((grads[name] - ref).norm() / ref.norm().clamp_min(1e-30))
            for name, ref in reference.items()}


def _fresh(runtime, params, shape, device, seed: int = 0):
    from gpu_models import build_llama

    runtime.reset()
    runtime.init(params)
    return runtime.transform(build_llama(shape, device, seed=seed))


def test_fp16_scaler_recovers_underflowed_gradients_and_skips_inf(runtime, device, shape,
                                                                  record_property):
    """mixed_precision: "fp16" with grad_scaler(): unscaled, most gradients flush to zero;
    scaled, the zero count is fp32's (their size against fp32 is the series' test below); an
    inf gradient skips the step and halves the scale."""
    from meshtrain_runtime.grad import grad_scaler

    ids = token_ids(shape, device)

    def loss_of(model):
        return model(input_ids=ids, labels=ids).loss * LOSS_FACTOR

    reference_model = _fresh(runtime, {}, shape, device)
    loss_of(reference_model).backward()
    reference = _grads(reference_model)
    unscaled = _fresh(runtime, {"mixed_precision": "fp16"}, shape, device)
    loss_of(unscaled).backward()
    unscaled_zeros = _zeros(_grads(unscaled))
    model = _fresh(runtime, {"mixed_precision": "fp16"}, shape, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = grad_scaler()
    assert scaler.is_enabled()
    scaler.scale(loss_of(model)).backward()
    scaler.unscale_(optimizer)
    grads = _grads(model)
    numel = sum(g.numel() for g in grads.values())
    record_property("figure", f"fp16 zero gradients: fp32 {_zeros(reference)}, unscaled "
                              f"{unscaled_zeros}, scaled {_zeros(grads)} of {numel}")
    assert unscaled_zeros - _zeros(reference) > 0.3 * numel
    assert _zeros(grads) - _zeros(reference) <= 1e-3 * numel
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.scale(loss_of(model)).backward()
    next(iter(model.parameters())).grad.to_local().view(-1)[0] = float("inf")
    before = [p.to_local().clone() for p in model.parameters()]
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(b, p.to_local()) for b, p in zip(before, model.parameters(),
                                                            strict=True))
    assert scaler.get_scale() == 2.0**15


SERIES = {"cuda": ((0, 1, 2), 3), "cpu": ((0, 1), 2)}
"""(seeds, steps) of the fp16 series: the smoke run on CPU checks the machinery on fewer."""
FP16_BOUND = 5e-2


def _copy_weights(source, target) -> None:
    """`target`'s fp32 parameters := `source`'s (a world of one: local shards are whole)."""
    with torch.no_grad():
        for src, dst in zip(source.parameters(), target.parameters(), strict=True):
            whole(dst).copy_(whole(src))


def _worst_gap(grads, reference) -> tuple[str, float]:
    gaps = _l2_gaps(grads, reference)
    worst = max(gaps, key=gaps.__getitem__)
    return worst, gaps[worst]


def fp16_gap_series(runtime, shape, device, seeds, steps):
    """For each seed and each of `steps` AdamW steps of an fp16 model trained with the
    scaler: the worst tensor's relative L2 gap of its unscaled gradients, and of bf16's, to
    fp32's gradients of the same weights on the same batch (the fp32 and bf16 models get the
    fp16 model's fp32 weights before every step). One row per (seed, step)."""
    from meshtrain_runtime.grad import grad_scaler

    rows = []
    for seed in seeds:
        ids = token_ids(shape, device, seed=seed + 1)
        fp32 = _fresh(runtime, {}, shape, device, seed)
        bf16 = _fresh(runtime, {"mixed_precision": "bf16"}, shape, device, seed)
        fp16 = _fresh(runtime, {"mixed_precision": "fp16"}, shape, device, seed)
        optimizer = torch.optim.AdamW(fp16.parameters(), lr=1e-3)
        scaler = grad_scaler()
        for step in range(steps):
            for other in (fp32, bf16):
                _copy_weights(fp16, other)
                other.zero_grad(set_to_none=True)
                (other(input_ids=ids, labels=ids).loss * LOSS_FACTOR).backward()
            scaler.scale(fp16(input_ids=ids, labels=ids).loss * LOSS_FACTOR).backward()
            scaler.unscale_(optimizer)
            reference = _grads(fp32)
            tensor, gap = _worst_gap(_grads(fp16), reference)
            rows.append({"seed": seed, "step": step, "fp16": gap, "tensor": tensor,
                         "bf16": _worst_gap(_grads(bf16), reference)[1],
                         "scale": float(scaler.get_scale())})
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    return rows


def test_fp16_scaled_gradients_track_fp32_over_a_series(runtime, device, shape,
                                                        record_property):
    """fp16 with the scaler against fp32 on the same weights, per tensor in relative L2, over
    3 seeds x 3 AdamW steps on a GPU (`fp16_gap_series`; the CPU smoke run 2 x 2): every row
    within FP16_BOUND = 5e-2.

    Where the bound stands: one H200 measurement (2026-11-27, torch 2.11; seed 0, first step
    only, this file's earlier form) gave 2.6e-2 for fp16 (layer 1's q_proj: q/k gradients at
    initialisation are small differences of large terms, and at the first step's scale some
    activation gradients are fp16 subnormals) beside 1.3e-2 for bf16; the bound was set to 5e-2
    after it, from that one figure, not from a series. This series is the machinery to argue
    it from; its first figures are CPU ones (CPU_SHAPE, CPU kernels, 3 x 3, 2026-11-28: fp16
    3.2e-3..4.2e-3 over the 9 rows, layer 1's q_proj the worst, bf16 max 1.6e-2), which say
    nothing about a GPU's fp16 matmuls.
    The next GPU run records the series as this test's figure; until then 5e-2 is a single
    measurement's 2x margin. A scaler that did not unscale is off by its 2**16, one that
    flushed to zero by 1.
    """
    seeds, steps = SERIES[device.type]
    rows = fp16_gap_series(runtime, shape, device, seeds, steps)
    worst = max(rows, key=lambda row: row["fp16"])
    series = "; ".join(f"s{r['seed']}/{r['step']} {r['fp16']:.1e}" for r in rows)
    record_property("figure", f"fp16 worst L2 gap per seed/step: {series}; max {worst['fp16']:.2e}"
                              f" ({worst['tensor']}, seed {worst['seed']}, step {worst['step']});"
                              f" bf16 max {max(r['bf16'] for r in rows):.2e}")
    assert len(rows) == len(seeds) * steps
    assert worst["fp16"] <= FP16_BOUND, worst


def test_fp8_linears_track_bf16(runtime, cuda_device, shape, record_property):
    """fp8: true (torchao Float8Linear in the blocks, bf16 compute elsewhere) against bf16: the
    loss within 2 % over 3 steps (float8 e4m3 keeps 3 mantissa bits; tensorwise scaling)."""
    from meshtrain.contract.errors import ConfigError
    from meshtrain_runtime.parallel.float8 import check_fp8

    try:
        check_fp8(True, cuda_device)
    except ConfigError as refusal:  # e.g. an A100, or torchao not carried to this machine
        pytest.skip(f"fp8 refused here: {refusal}")
    bf16 = train(runtime, {"mixed_precision": "bf16"}, shape, cuda_device)
    fp8 = train(runtime, {"mixed_precision": "bf16", "fp8": True}, shape, cuda_device)
    converted = [type(m).__name__ for m in fp8.model.model.layers[0].modules()]
    assert converted.count("Float8Linear") == 7  # q, k, v, o, gate, up, down
    # the head stays bf16 (FSDP2 renames a sharded module's class: FSDPLinear)
    assert "Float8" not in type(fp8.model.lm_head).__name__
    assert isinstance(fp8.model.lm_head, torch.nn.Linear)
    gaps = [abs(a / b - 1) for a, b in zip(fp8.losses, bf16.losses, strict=True)]
    record_property("figure", f"fp8 vs bf16 relative loss gap per step: {max(gaps):.2e}")
    assert max(gaps) < 2e-2, (fp8.losses, bf16.losses)
    assert fp8.losses[-1] < fp8.losses[0]


def _dense_experts(tokens, top_k_index, top_k_weights, gate_up, down):
    """Each token through each of its experts one by one, in float64 (the reference)."""
    out = torch.zeros_like(tokens, dtype=torch.float64)
    for t in range(tokens.shape[0]):
        for slot in range(top_k_index.shape[1]):
            e = int(top_k_index[t, slot])
            gate, up = (gate_up[e].detach().double() @ tokens[t].double()).chunk(2)
            hidden = torch.nn.functional.silu(gate) * up
            out[t] += top_k_weights[t, slot].double() * (down[e].detach().double() @ hidden)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_expert_matmuls_match_a_dense_reference(runtime, device, dtype):
    """EP's expert compute (GroupedExperts: tokens sorted by expert, one matmul per expert's
    rows, outputs weighted and summed back) against a per-token float64 loop, output and
    weight gradients; one expert receives no token (its gradient must be zero, not missing)."""
    from meshtrain_runtime.modules.moe import GroupedExperts

    torch.manual_seed(0)
    experts = GroupedExperts(num_experts=4, hidden_size=32, intermediate_size=48).to(device)
    experts.reset_parameters()
    experts.to(dtype)
    tokens = torch.randn(24, 32, device=device, dtype=dtype)
    top_k_index = torch.randint(0, 3, (24, 2), device=device)  # expert 3 gets nothing
    top_k_weights = torch.softmax(torch.randn(24, 2, device=device), dim=-1).to(dtype)
    out = experts(tokens, top_k_index, top_k_weights)
    reference = _dense_experts(tokens, top_k_index, top_k_weights, experts.gate_up_proj,
                               experts.down_proj)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    scale = float(reference.abs().max())
    assert float((out.detach().double() - reference).abs().max()) <= tolerance * scale
    out.float().square().sum().backward()
    assert experts.gate_up_proj.grad is not None and experts.down_proj.grad is not None
    assert float(experts.gate_up_proj.grad[3].abs().max()) == 0.0
    assert float(experts.gate_up_proj.grad[:3].abs().max()) > 0.0
