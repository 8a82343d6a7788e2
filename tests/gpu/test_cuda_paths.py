"""transform()'s CUDA paths on one GPU, each against the eager / fp32 run of the same model.

Every case trains a tiny Llama from one seed for 3 AdamW steps on one batch through
init() / transform() (a world of one) and compares losses and final weights with a reference
run. Bounds: fp32 paths that only reorder work (checkpointing, offloading, fused AdamW,
cpu_offload) within 1e-5; compile within 1e-4 (inductor reorders float32 reductions, as in
tests/runtime/test_compile_parity.py); bf16 compute within 3e-2 of fp32 on the loss (bf16 keeps
8 bits of mantissa: ~4e-3 relative per matmul, the loss here is ~6). A wrong layout or a
dropped gradient moves the loss by 1e-1 or more after 3 steps.
"""

from __future__ import annotations

import time

import pytest
import torch
from gpu_models import Run, largest_difference, train

pytestmark = pytest.mark.gpu


def test_bf16_mixed_precision_tracks_fp32(runtime, device, shape, record_property):
    """mixed_precision: "bf16": blocks compute with bf16 weights, the states stay fp32."""
    reference = train(runtime, {}, shape, device)
    seen: list[torch.dtype] = []

    def watch(model) -> None:
        model.model.layers[0].register_forward_pre_hook(
            lambda block, args: seen.append(block.mlp.down_proj.weight.dtype))

    mixed = train(runtime, {"mixed_precision": "bf16"}, shape, device, on_model=watch)
    assert seen and set(seen) == {torch.bfloat16}
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    gaps = [abs(a - b) for a, b in zip(mixed.losses, reference.losses, strict=True)]
    record_property("figure", f"bf16 vs fp32 loss gap per step: {max(gaps):.2e}")
    assert max(gaps) < 3e-2, (mixed.losses, reference.losses)
    assert mixed.losses[-1] < mixed.losses[0]


@pytest.mark.parametrize("policy", [True, "selective"], ids=["full", "selective"])
def test_checkpointing_matches_eager(runtime, device, shape, policy):
    """activation_checkpointing True (full) and "selective" (matmul and attention outputs kept;
    on CUDA SDPA's flash kernel is one of them)."""
    eager = train(runtime, {}, shape, device)
    checkpointed = train(runtime, {"activation_checkpointing": policy}, shape, device)
    assert checkpointed.losses == pytest.approx(eager.losses, rel=1e-5)
    assert largest_difference(checkpointed.weights, eager.weights) < 1e-5


def _timed(runtime, params, shape, device) -> tuple[Run, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run = train(runtime, params, shape, device, steps=3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return run, time.perf_counter() - start


def test_activation_offloading_moves_the_inputs_and_matches(runtime, device, shape,
                                                            record_property):
    """activation_offloading: every checkpointed block's inputs go to host memory and come back
    ahead of use (prefetched, overlapping the previous block's backward), same numbers."""
    from meshtrain_runtime.parallel.activations import get_offload_stats

    checkpointed, ac_s = _timed(runtime, {"activation_checkpointing": True}, shape, device)
    params = {"activation_checkpointing": True, "activation_offloading": True}
    offloaded, offload_s = _timed(runtime, params, shape, device)
    assert offloaded.losses == pytest.approx(checkpointed.losses, rel=1e-5)
    assert largest_difference(offloaded.weights, checkpointed.weights) < 1e-5
    stats = get_offload_stats(offloaded.model)
    # each step offloads every block's input: batch x seq x hidden fp32
    per_step = shape.layers * shape.batch * shape.seq_len * shape.hidden * 4
    assert stats.bytes_offloaded == 3 * per_step
    if device.type == "cuda":
        assert stats.bytes_copied == stats.bytes_offloaded
        assert stats.prefetched_loads > 0, stats
        assert stats.max_resident_blocks <= 2, stats  # the loading horizon
    else:
        assert stats.bytes_copied == 0  # on a CPU host the inputs already live there
    record_property("figure", f"offloading: {stats.bytes_copied} B copied in 3 steps, "
                              f"{stats.prefetched_loads} of {stats.loads} loads prefetched; "
                              f"3 steps {offload_s:.2f} s vs {ac_s:.2f} s checkpointing alone")


def test_cpu_offload_matches_the_device_run(runtime, cuda_device, shape):
    """cpu_offload: parameters, gradients and AdamW state live in host memory; same numbers."""
    on_device = train(runtime, {}, shape, cuda_device)
    offloaded = train(runtime, {"cpu_offload": True}, shape, cuda_device)
    devices = {p.to_local().device.type for p in offloaded.model.parameters()}
    assert devices == {"cpu"}
    assert offloaded.losses == pytest.approx(on_device.losses, rel=1e-5)
    assert largest_difference(offloaded.weights, on_device.weights) < 1e-5


@pytest.mark.parametrize("policy", [True, "selective"], ids=["full", "selective"])
def test_compile_matches_eager(runtime, cuda_device, shape, record_property, policy):
    """compile: true (per-block inductor on CUDA, triton kernels) with checkpointing, full and
    selective (the throughput goal's layout: selective + compile)."""
    params = {"activation_checkpointing": policy}
    eager = train(runtime, params, shape, cuda_device)
    torch._dynamo.reset()
    start = time.perf_counter()
    compiled = train(runtime, {**params, "compile": True}, shape, cuda_device)
    seconds = time.perf_counter() - start
    record_property("figure", f"compile ({params['activation_checkpointing']}): 3 steps incl. "
                              f"compiling {seconds:.1f} s")
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4, abs=1e-4)
    assert largest_difference(compiled.weights, eager.weights) < 1e-4


def test_fused_adamw_matches_foreach(runtime, device, shape):
    """AdamW(fused=True) on FSDP2's DTensor shards: the same weights as the default (foreach)."""
    foreach = train(runtime, {}, shape, device)
    fused = train(runtime, {}, shape, device, fused=True)
    assert fused.losses == pytest.approx(foreach.losses, rel=1e-6)
    assert largest_difference(fused.weights, foreach.weights) < 1e-6
