"""`compile` and `fp8` keys: contract types, and ConfigErrors where they cannot apply (1 process).

The compile parity runs are in test_compile_parity.py (one 4-rank launch). fp8's device checks:
the CPU refusal goes through transform(); the GPU branches are unit-checked with a fake device
capability. What fp8 converts, and its training on gloo ranks, are in test_float8.py and
test_hsdp_layouts.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from meshtrain.contract import parse_smp_parameters
from meshtrain.errors import ConfigError


class _NoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("key", ["compile", "fp8"])
@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_wrong_types_are_config_errors(key: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_smp_parameters({key: bad})


def test_defaults_off() -> None:
    params = parse_smp_parameters({})
    assert params.compile is False and params.fp8 is False


def test_compile_without_blocks(single_process_runtime: Any) -> None:
    import meshtrain_runtime as mr

    mr.init({"compile": True})
    with pytest.raises(ConfigError, match="no blocks were found"):
        mr.transform(_NoBlocks())


def test_compile_with_activation_offloading(single_process_runtime: Any) -> None:
    import meshtrain_runtime as mr

    mr.init({"compile": True, "activation_checkpointing": True, "activation_offloading": True})
    model = _Stack()
    with pytest.raises(ConfigError, match="activation_offloading"):
        mr.transform(model)
    assert model.layers[0]._compiled_call_impl is None  # nothing was changed


def test_compile_without_a_cxx_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshtrain_runtime.parallel import compile as compile_module

    monkeypatch.setattr(compile_module.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="C\\+\\+ compiler"):
        compile_module.check_compile(blocks=[nn.Linear(2, 2)], device_type="cpu",
                                     activation_offloading=False)


def test_compile_marks_blocks_before_fsdp(single_process_runtime: Any) -> None:
    import meshtrain_runtime as mr

    mr.init({"compile": True})
    model = mr.transform(_Stack())
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert torch.equal(model(torch.ones(1, 4)), model(torch.ones(1, 4)))


def test_fp8_refused_on_cpu(single_process_runtime: Any) -> None:
    import meshtrain_runtime as mr

    mr.init({"fp8": True})
    with pytest.raises(ConfigError, match="H100-class"):
        mr.transform(_Stack())


@pytest.mark.parametrize(("capability", "torchao", "match"), [
    ((8, 0), True, "compute capability 8.0"),
    ((9, 0), False, "torchao is not installed"),
    ((9, 0), True, None),  # an H100 with torchao: accepted
    ((10, 0), True, None),
])
def test_fp8_gpu_branches(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int],
                          torchao: bool, match: str | None) -> None:
    from meshtrain_runtime.parallel import float8

    monkeypatch.setattr(float8.torch.cuda, "get_device_capability", lambda device: capability)
    monkeypatch.setattr(float8.torch.cuda, "get_device_name", lambda device: "FakeGPU")
    monkeypatch.setattr(float8.importlib.util, "find_spec",
                        lambda name: object() if torchao else None)
    if match is None:
        float8.check_fp8(True, torch.device("cuda", 0))
    else:
        with pytest.raises(ConfigError, match=match):
            float8.check_fp8(True, torch.device("cuda", 0))
    float8.check_fp8(False, torch.device("cuda", 0))  # off: nothing is checked


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"tensor_parallel_degree": 2, "activation_checkpointing": True}, "DunderDictVariable"),
    ({"expert_parallel_degree": 2, "activation_checkpointing": True}, "data-dependent"),
    # a selective block is the same checkpoint region: the same refusals, naming the policy
    ({"tensor_parallel_degree": 2, "activation_checkpointing": "selective"},
     "activation_checkpointing='selective': inside a checkpointed block"),
    ({"expert_parallel_degree": 2, "activation_checkpointing": "selective"},
     "activation_checkpointing='selective': the expert all-to-all"),
])
def test_compile_refusals_with_tp_and_ep_checkpointing(kwargs: dict, match: str) -> None:
    from meshtrain_runtime.parallel.compile import check_compile

    with pytest.raises(ConfigError, match=match):
        check_compile(blocks=[nn.Linear(2, 2)], device_type="cpu", activation_offloading=False,
                      **kwargs)
    check_compile(blocks=[nn.Linear(2, 2)], device_type="cpu", activation_offloading=False,
                  expert_parallel_degree=2)  # EP without checkpointing is supported
    check_compile(blocks=[nn.Linear(2, 2)], device_type="cpu", activation_offloading=False,
                  tensor_parallel_degree=2)  # so is TP
