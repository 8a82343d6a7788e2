"""transform() in a single plain process: order of checks, options, and error paths.

Multi-rank parity of every layout is in test_hsdp_layouts.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from workers.hsdp_support import build_custom, build_llama, dataset, loss_of

import meshtrain_runtime
from meshtrain.errors import ConfigError


def _is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(m, FSDPModule) for m in model.modules())


def test_transform_before_init(single_process_runtime) -> None:
    with pytest.raises(RuntimeError, match="not initialised"):
        meshtrain_runtime.transform(build_custom())


@pytest.mark.parametrize("build", [build_llama, build_custom], ids=["llama", "custom"])
def test_one_rank_matches_the_plain_model(single_process_runtime, build) -> None:
    meshtrain_runtime.init()
    plain = build()
    model = meshtrain_runtime.transform(copy.deepcopy(plain))
    assert all(isinstance(p, DTensor) for p in model.parameters())
    tokens = dataset()[:8]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (plain, model)]
    for _ in range(3):
        losses = []
        for m, optimizer in zip((plain, model), optimizers, strict=True):
            loss = loss_of(m, tokens)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
        assert losses[0] == pytest.approx(losses[1], abs=1e-6)


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"activation_checkpointing": True}, "activation_checkpointing=True asks for activation "
         "checkpointing, which is not available in this build"),
        ({"activation_checkpointing": True, "activation_offloading": True},
         "activation_checkpointing=True"),
        ({"sequence_parallel": True}, "sequence_parallel=True asks for sequence parallelism"),
        ({"cpu_offload": True}, "but this process runs on the CPU (no CUDA device): there is "
         "nothing to offload from. Set cpu_offload=False"),
    ],
)
def test_unavailable_requests_fail_before_touching_the_model(
    single_process_runtime, params, fragment
) -> None:
    meshtrain_runtime.init(params)
    model = build_custom()
    with pytest.raises(ConfigError) as caught:
        meshtrain_runtime.transform(model)
    assert fragment in str(caught.value)
    assert not _is_sharded(model)
    assert not any(isinstance(p, DTensor) for p in model.parameters())


def test_transform_twice(single_process_runtime) -> None:
    meshtrain_runtime.init()
    model = meshtrain_runtime.transform(build_custom())
    with pytest.raises(ConfigError, match="already sharded"):
        meshtrain_runtime.transform(model)


def test_device_and_dtype_arguments(single_process_runtime) -> None:
    meshtrain_runtime.init()
    with pytest.raises(ConfigError, match="mesh is on cpu"):
        meshtrain_runtime.transform(build_custom(), device="cuda")
    with pytest.raises(ConfigError, match="floating-point dtype"):
        meshtrain_runtime.transform(build_custom(), dtype=torch.int64)
    model = meshtrain_runtime.transform(build_custom(), device="cpu", dtype=torch.float64)
    assert {p.dtype for p in model.parameters()} == {torch.float64}


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_fp32_state(
    single_process_runtime,
) -> None:
    meshtrain_runtime.init({"mixed_precision": "bf16"})
    plain = build_custom()
    model = meshtrain_runtime.transform(copy.deepcopy(plain))
    tokens = dataset()[:8]
    logits = model(tokens[:, :-1])
    assert logits.dtype == torch.bfloat16
    loss = loss_of(model, tokens)
    loss.backward()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    reference = float(loss_of(plain, tokens).detach())
    assert float(loss.detach()) != reference
    assert float(loss.detach()) == pytest.approx(reference, abs=2e-2)  # bf16 rounding, not a bug


def test_explicit_blocks_are_used(single_process_runtime) -> None:
    meshtrain_runtime.init()
    model = build_custom()
    chosen = [model.layers[0], model.norm]
    meshtrain_runtime.transform(model, blocks=chosen)
    sharded = [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    assert sharded == ["", "layers.0", "norm"]
