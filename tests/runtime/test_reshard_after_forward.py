"""The `reshard_after_forward` key: the no_shard memory / step-time trade-off, measured on CPU.

One process (world size 1: the layout resolves to ``no_shard``), tiny Llama in bf16 mixed
precision (FSDP2 gathers a bf16 copy of every parameter). Between forward and backward:

- "auto" (no_shard's default, reshard_after_forward=False) keeps every group's gathered
  parameters: predicted bytes = all parameters x 2 (bf16);
- True frees them after forward; only the output head (never resharded after forward: backward
  needs it first) and the root group (final norm) stay gathered: predicted = (head + norm) x 2.

The saved activations (runtime.memory's meter) are the same either way: the difference is only
the gathered parameters. Step times are measured and printed (pytest -s), never asserted.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from meshtrain.contract import parse_smp_parameters
from meshtrain.errors import ConfigError


def _model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=32))


def _measure(state: Any, setting: Any) -> dict[str, Any]:
    import meshtrain_runtime as mr
    from meshtrain_runtime.diagnostics.memory import SavedActivationMeter
    from meshtrain_runtime.parallel.fsdp import unsharded_parameter_bytes

    state.reset()
    params = {"mixed_precision": "bf16"}
    if setting is not None:
        params["reshard_after_forward"] = setting
    mr.init(params)
    model = mr.transform(_model())
    whole = {n: p.numel() for n, p in _model().named_parameters()}
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        with SavedActivationMeter() as meter:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        after_forward = unsharded_parameter_bytes(model)
        loss.backward()
        times.append(time.perf_counter() - start)
        model.zero_grad()
    return {"strategy": mr.state.sharding_strategy, "after_forward": after_forward,
            "saved": meter.result.bytes, "ms": 1e3 * sorted(times)[1], "numel": whole}


def test_reshard_trade_off_on_one_rank(single_process_runtime: Any) -> None:
    keep = _measure(single_process_runtime, None)
    free = _measure(single_process_runtime, True)
    numel = keep["numel"]
    assert keep["strategy"] == "no_shard"
    bf16 = 2
    assert keep["after_forward"] == bf16 * sum(numel.values())
    head_and_root = numel["lm_head.weight"] + numel["model.norm.weight"]
    assert free["after_forward"] == bf16 * head_and_root
    assert free["saved"] == keep["saved"]  # activations are not what differs
    explicit = _measure(single_process_runtime, False)
    assert explicit["after_forward"] == keep["after_forward"]
    print(f"\nno_shard, 1 rank: gathered after forward {keep['after_forward']} B (keep) vs "
          f"{free['after_forward']} B (reshard); step {keep['ms']:.1f} ms vs {free['ms']:.1f} ms")


@pytest.mark.parametrize("bad", ["yes", 1, None, "true"])
def test_wrong_type_is_a_config_error(bad: Any) -> None:
    with pytest.raises(ConfigError, match="reshard_after_forward"):
        parse_smp_parameters({"reshard_after_forward": bad})


def test_accepted_values() -> None:
    for value in (True, False, "auto"):
        assert parse_smp_parameters({"reshard_after_forward": value}).reshard_after_forward \
            == value
    assert parse_smp_parameters({}).reshard_after_forward == "auto"


def test_resolution() -> None:
    from meshtrain_runtime.parallel.fsdp import resolve_reshard_after_forward

    assert resolve_reshard_after_forward("auto", True) is True
    assert resolve_reshard_after_forward("auto", False) is False
    assert resolve_reshard_after_forward(True, False) is True
    assert resolve_reshard_after_forward(False, True) is False
    with pytest.raises(ConfigError, match="true, false or"):
        resolve_reshard_after_forward("always", True)
