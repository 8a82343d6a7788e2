"""Pipeline split in one plain process: stage bounds and placement, every stage of a model run
in turn equals the unsplit model (HF decoders through their own forward on every transformers
version; plain models through their traced forward), what HF models are refused, and
forward_backward without pipelining (gradient accumulation).

Multi-rank parity for every schedule and layout, and the refusals on every rank:
test_pipeline_parity.py.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import (
    GraniteConfig,
    GraniteForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from workers.hsdp_support import build_llama
from workers.pipeline_models import HF_TINY, NanoGPT, build_gpt

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime.parallel.blocks import find_blocks
from meshtrain_runtime.parallel.pipeline import (
    build_pipeline,
    local_stage_indices,
    plan_pipeline,
    stage_bounds,
)
from meshtrain_runtime.parallel.pipeline.hf import shallow_module_copy


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


def _params(pp: int = 2, schedule: str = "1F1B", per_rank: int = 1,
            split: list[int] | None = None) -> SimpleNamespace:
    return SimpleNamespace(pipeline_parallel_degree=pp, stages_per_rank=per_rank,
                           pipeline_split_points=split, pipeline_schedule=schedule)


def _stages(model: nn.Module, params: SimpleNamespace) -> list[nn.Module]:
    """Every stage of every pipeline rank, by stage index."""
    plan = plan_pipeline(model, find_blocks(model), params=params)
    stages = {}
    for rank in range(params.pipeline_parallel_degree):
        for stage in build_pipeline(model, plan, params=params, pp_rank=rank).stage_modules:
            stages[stage.stage_index] = stage
    return [stages[i] for i in range(len(stages))]


def _run_in_turn(stages: list[nn.Module], tokens: torch.Tensor) -> torch.Tensor:
    values: tuple = (tokens,)
    for stage in stages:
        out = stage(*values)
        values = out if isinstance(out, tuple) else (out,)
    return out


HF_MODELS = {
    "llama": lambda: build_llama(layers=4),
    "mistral_window_3": lambda: MistralForCausalLM(MistralConfig(**HF_TINY, sliding_window=3)),
    # window on layers 2-3 only: per-layer mask types, indexed by position in 5.x's forward
    "qwen2_windowed_layers": lambda: Qwen2ForCausalLM(Qwen2Config(
        **HF_TINY, use_sliding_window=True, sliding_window=3, max_window_layers=2)),
    "mixtral": lambda: MixtralForCausalLM(MixtralConfig(**HF_TINY, num_local_experts=4,
                                                        num_experts_per_tok=2)),
}


HF_CASES = [(name, (2, "1F1B", 1)) for name in sorted(HF_MODELS)] + [
    ("llama", (4, "1F1B", 1)), ("llama", (2, "ZBVZeroBubble", 2))]


@pytest.mark.parametrize(("name", "layout"), HF_CASES)
def test_hf_stages_in_turn_are_the_unsplit_model(name: str, layout: tuple) -> None:
    """Each stage runs the model's own forward (inputs_embeds after the first) on its blocks:
    in turn they give the unsplit model's logits, sliding windows and MoE included, and the
    model itself is left whole."""
    torch.manual_seed(0)
    model = HF_MODELS[name]()
    pp, schedule, per_rank = layout
    stages = _stages(model, _params(pp, schedule, per_rank))
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = model(tokens).logits, _run_in_turn(stages, tokens)
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()
    base = model.model
    assert len(base.layers) == 4 and isinstance(base.embed_tokens, nn.Embedding)
    assert not isinstance(base.norm, nn.Identity)


def test_the_sliding_window_changes_the_logits() -> None:
    """The Mistral case above is a real check: a 3-token window over 10 tokens attends less
    far back than the causal mask of the same weights."""
    torch.manual_seed(0)
    windowed = MistralForCausalLM(MistralConfig(**HF_TINY, sliding_window=3))
    causal = MistralForCausalLM(MistralConfig(**HF_TINY, sliding_window=None))
    causal.load_state_dict(windowed.state_dict())
    tokens = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        assert not torch.allclose(windowed(tokens).logits, causal(tokens).logits, atol=1e-4)


def test_a_shallow_module_copy_swaps_children_on_the_copy_only() -> None:
    model = build_llama(layers=2)
    view = shallow_module_copy(model.model)
    view.register_module("norm", nn.Identity())
    assert isinstance(view.norm, nn.Identity) and not isinstance(model.model.norm, nn.Identity)
    assert view.layers is model.model.layers and view.embed_tokens is model.model.embed_tokens


@pytest.mark.parametrize(("build", "quoted"), [
    (lambda: GraniteForCausalLM(GraniteConfig(**HF_TINY, embedding_multiplier=2.0)),
     "do not reproduce the unsplit model's logits"),
    (lambda: MixtralForCausalLM(MixtralConfig(**HF_TINY, num_local_experts=4,
                                              output_router_logits=True)),
     "output_router_logits=True"),
], ids=["granite_scales_inputs_embeds", "router_logits"])
def test_hf_models_the_stages_cannot_reproduce_are_refused(build, quoted: str) -> None:
    torch.manual_seed(0)
    model = build()
    with pytest.raises(ConfigError, match=quoted):
        plan_pipeline(model, find_blocks(model), params=_params())


PLAIN_CASES = [("gpt", layout) for layout in ((2, "1F1B", 1, None), (4, "1F1B", 1, None),
                                             (2, "Interleaved1F1B", 2, None),
                                             (2, "1F1B", 1, [3]))] + [
    ("nanogpt", (2, "1F1B", 1, None)), ("nanogpt", (4, "1F1B", 1, None))]


@pytest.mark.parametrize(("name", "layout"), PLAIN_CASES)
def test_plain_stages_in_turn_are_the_unsplit_model(name: str, layout: tuple) -> None:
    """The traced forward cut at the blocks: positions read from a weight, masks built from
    the input's shape, a residual around the block list, code between blocks, nested module
    paths: in turn the stages give the model's own output, under the model's names."""
    torch.manual_seed(0)
    model = build_gpt() if name == "gpt" else NanoGPT()
    stages = _stages(model, _params(*layout))
    tokens = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(_run_in_turn(stages, tokens), model(tokens))
    held = {n for stage in stages for n, _ in stage.named_parameters()}
    assert held == {n for n, _ in model.named_parameters()}


def test_a_traced_assert_stays_a_runtime_check() -> None:
    """The forward's `assert t <= MAX_SEQ` is kept in the stage that holds it."""
    stages = _stages(build_gpt(), _params())
    with pytest.raises(AssertionError, match="failed"):
        stages[0](torch.zeros(1, 17, dtype=torch.long))


def test_the_traced_model_is_left_as_it_was() -> None:
    """Tracing stores tensors the forward creates on the model; the split takes them back."""
    model = NanoGPT()
    before = set(vars(model))
    _stages(model, _params())
    assert set(vars(model)) == before


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
