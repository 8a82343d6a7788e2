"""transform() in a single plain process: order of checks, options, and error paths.

Multi-rank parity: test_hsdp_layouts.py (FSDP layouts) and test_transform_integration.py (tensor,
expert parallelism and activation checkpointing from the parameters).
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
        ({"sequence_parallel": True}, "sequence_parallel=True splits activations over the "
         "tensor-parallel ranks, but tensor_parallel_degree=1: there is nothing to split"),
        ({"loss_parallel": True}, "loss_parallel=True splits activations"),
        ({"cpu_offload": True}, "but this process runs on the CPU (no CUDA device): there is "
         "nothing to offload from. Set cpu_offload=False"),
    ],
)
def test_impossible_requests_fail_before_touching_the_model(
    single_process_runtime, params, fragment
) -> None:
    meshtrain_runtime.init(params)
    model = build_custom()
    with pytest.raises(ConfigError) as caught:
        meshtrain_runtime.transform(model)
    assert fragment in str(caught.value)
    assert not _is_sharded(model)
    assert not any(isinstance(p, DTensor) for p in model.parameters())


def test_checkpointing_without_blocks_fails_before_touching_the_model(
    single_process_runtime,
) -> None:
    meshtrain_runtime.init({"activation_checkpointing": True, "activation_offloading": True})
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="no transformer blocks were found in Sequential"):
        meshtrain_runtime.transform(model)
    assert not _is_sharded(model)
    assert not any(isinstance(p, DTensor) for p in model.parameters())


def test_moe_config_arguments(single_process_runtime) -> None:
    from meshtrain_runtime.modules.moe import MoEConfig

    meshtrain_runtime.init()
    with pytest.raises(ConfigError, match="both moe_config= and config="):
        meshtrain_runtime.transform(build_custom(), moe_config=MoEConfig(), config=MoEConfig())
    with pytest.raises(ConfigError,
                       match=r"takes a meshtrain_runtime\.modules\.moe\.MoEConfig, got dict"):
        meshtrain_runtime.transform(build_custom(), config={"moe_aux_loss_coeff": 0.1})
    # Without expert parallelism the MoE options (and a tp_plan without TP) are not used.
    model = meshtrain_runtime.transform(
        build_custom(), config=MoEConfig(), tp_plan={"x": "colwise"}
    )
    assert _is_sharded(model)


def _first_step_grads(params: dict, **transform_kwargs) -> tuple[float, dict[str, torch.Tensor]]:
    from meshtrain_runtime.parallel.activations import checkpointed_blocks

    meshtrain_runtime.reset()
    meshtrain_runtime.init(params)
    model = meshtrain_runtime.transform(build_llama(), **transform_kwargs)
    expected = 2 if params.get("activation_checkpointing") else 0  # build_llama: 2 layers
    assert len(checkpointed_blocks(model)) == expected
    loss = loss_of(model, dataset()[:8])
    loss.backward()
    return float(loss.detach()), {n: p.grad.to_local().clone() for n, p in model.named_parameters()}


def test_checkpointing_and_offloading_from_the_parameters(single_process_runtime) -> None:
    plain_loss, plain = _first_step_grads({})
    for params in (
        {"activation_checkpointing": True},
        {"activation_checkpointing": True, "activation_offloading": True,
         "activation_loading_horizon": 1},
        {"activation_checkpointing": True, "activation_offloading": True,
         "sm_activation_offloading": False},
    ):
        loss, grads = _first_step_grads(params)
        assert loss == plain_loss, params
        assert all(torch.equal(grads[name], plain[name]) for name in plain), params


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


def test_importing_the_submodule_keeps_transform_callable():
    import subprocess
    import sys

    code = ("import meshtrain_runtime as mr\n"
            "from meshtrain_runtime.parallelize import apply_converters\n"
            "import meshtrain_runtime.state\n"
            "assert callable(mr.transform) and mr.transform.__name__ == 'transform'\n"
            "assert callable(mr.init)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
