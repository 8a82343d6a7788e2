"""Pipeline split and forward_backward in one plain process: stage bounds, placement of stages
on ranks, what can be split, and forward_backward without pipelining (gradient accumulation).

Multi-rank parity for every schedule and layout: test_pipeline_parity.py.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM
from workers.hsdp_support import TinyLM, build_llama

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime.parallel.blocks import find_blocks
from meshtrain_runtime.parallel.pipeline import (
    apply_pipeline,
    local_stage_indices,
    plan_stages,
    stage_bounds,
)


def test_stage_bounds_even_uneven_and_explicit() -> None:
    assert stage_bounds(4, 2, None) == [0, 2, 4]
    assert stage_bounds(5, 2, None) == [0, 3, 5]
    assert stage_bounds(6, 4, None) == [0, 2, 4, 5, 6]
    assert stage_bounds(4, 2, [1]) == [0, 1, 4]
    with pytest.raises(ConfigError, match="has 3 blocks but the pipeline needs 4 stages"):
        stage_bounds(3, 4, None)
    with pytest.raises(ConfigError, match=r"\[4\]: the model has 4 blocks \(indices 0-3\)"):
        stage_bounds(4, 2, [4])


def test_stages_per_rank_looped_and_in_a_v() -> None:
    assert [local_stage_indices(r, 2, 1, "1F1B") for r in range(2)] == [[0], [1]]
    assert [local_stage_indices(r, 2, 2, "Interleaved1F1B") for r in range(2)] == [[0, 2], [1, 3]]
    assert [local_stage_indices(r, 2, 2, "ZBVZeroBubble") for r in range(2)] == [[0, 3], [1, 2]]


def test_plans_for_hf_llama_and_a_plain_module() -> None:
    llama = build_llama(layers=2)
    plan = plan_stages(llama, find_blocks(llama))
    assert (plan.kind, plan.blocks_path, plan.pre, plan.post, plan.shared) == (
        "hf", "model.layers", ["model.embed_tokens"], ["model.norm", "lm_head"],
        ["model.rotary_emb"])
    tiny = TinyLM()
    plan = plan_stages(tiny, find_blocks(tiny))
    assert (plan.kind, plan.pre, plan.post) == ("plain", ["embed"], ["norm", "head"])


TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
        "tie_word_embeddings": False}


@pytest.mark.parametrize("name", ["llama", "mistral_window_3", "qwen2"])
def test_stages_chained_in_one_process_are_the_unsplit_model(name: str) -> None:
    """Every stage's forward (rotary embeddings and the mask rebuilt per stage) run in turn
    gives the unsplit model's logits: Mistral's sliding window (3 tokens, rows of 10) needs the
    sliding-window mask on every stage, a causal one would attend further back."""
    torch.manual_seed(0)
    model = {"llama": lambda: build_llama(layers=4),
             "mistral_window_3": lambda: MistralForCausalLM(MistralConfig(**TINY,
                                                                          sliding_window=3)),
             "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY))}[name]()
    params = SimpleNamespace(pipeline_parallel_degree=2, stages_per_rank=1,
                             pipeline_split_points=None, pipeline_schedule="1F1B")
    blocks = find_blocks(model)
    stages = [apply_pipeline(model, blocks, params=params, pp_rank=r).stage_modules[0]
              for r in range(2)]
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = model(tokens).logits, stages[1](stages[0](tokens))
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()


def test_models_that_cannot_be_split_are_refused() -> None:
    inner = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    nested = nn.Sequential(nn.Linear(2, 2), nn.Sequential(inner))
    with pytest.raises(ConfigError, match=r"plain nn\.Modules whose forward applies"):
        plan_stages(nested, find_blocks(nested))
    with pytest.raises(ConfigError, match="no blocks were found"):
        plan_stages(nn.Linear(2, 2), [])
    tiny = TinyLM()
    with pytest.raises(ConfigError, match="not exactly the items of one ModuleList"):
        plan_stages(tiny, [tiny.layers[0], tiny.layers[2]])


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@pytest.mark.parametrize("microbatches", [1, 4])
def test_forward_backward_without_pipelining_is_loss_backward(single_process_runtime,
                                                                microbatches: int) -> None:
    """microbatches > 1 without pipelining accumulates gradients: the same mean and gradients."""
    mr.init({"microbatches": microbatches})
    plain = build_llama(layers=2)
    model = mr.transform(copy.deepcopy(plain))
    tokens = torch.randint(0, 128, (8, 12), generator=torch.Generator().manual_seed(3))
    x, y = tokens[:, :-1], tokens[:, 1:]
    expected = _loss(plain(x).logits, y)
    expected.backward()
    got = mr.forward_backward(model, x, y, loss_fn=_loss)
    assert got.dtype == torch.float32 and got.shape == () and not got.requires_grad
    assert abs(float(got) - expected.item()) <= 1e-6
    for (name, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad.full_tensor(), atol=1e-6), name
    with pytest.raises(ConfigError, match="got 6 rows but microbatches=4") if microbatches == 4 \
            else _no_error():
        mr.forward_backward(model, x[:6], y[:6], loss_fn=_loss)


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False
