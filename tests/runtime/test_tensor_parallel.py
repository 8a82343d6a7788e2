"""Tensor-parallel plans, head checks and seeds, in one process (no torchrun).

The multi-process parity, placement, collective and RNG checks are in
test_tensor_parallel_multiprocess.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from meshtrain.errors import ConfigError
from meshtrain_runtime.parallel.plans import (
    PrepareRegionInput,
    build_parallelize_plan,
    expand_plan,
    resolve_tp_plan,
)
from meshtrain_runtime.parallel.tensor import (
    check_attention_heads,
    check_sequence_parallel,
    region_seed,
    tp_seed,
)

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from tp_models import CUSTOM_PLAN, CustomLM

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=64,
             max_position_embeddings=32)


def llama(heads: int = 8, kv_heads: int = 4, hidden: int = 32) -> nn.Module:
    config = LlamaConfig(**{**SMALL, "hidden_size": hidden}, num_attention_heads=heads,
                         num_key_value_heads=kv_heads)
    return LlamaForCausalLM(config)


def test_llama_plan_comes_from_its_config_with_vocab_parallel_ends() -> None:
    plan = resolve_tp_plan(llama(), None)
    assert plan.source == "LlamaConfig.base_model_tp_plan"
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert plan.styles[f"model.layers.1.self_attn.{proj}"] == "colwise"
    assert plan.styles["model.layers.0.self_attn.o_proj"] == "rowwise"
    assert plan.styles["model.layers.0.mlp.gate_proj"] == "colwise"
    assert plan.styles["model.layers.0.mlp.down_proj"] == "rowwise"
    assert plan.embedding == "model.embed_tokens" and plan.head == "lm_head"
    assert plan.regions == ("model.layers.0.mlp", "model.layers.0.self_attn",
                            "model.layers.1.mlp", "model.layers.1.self_attn")


@pytest.mark.parametrize("build, attention, mlp", [
    (lambda: GPTNeoXForCausalLM(GPTNeoXConfig(**SMALL, num_attention_heads=4)),
     "gpt_neox.layers.0.attention", "gpt_neox.layers.0.mlp"),
    (lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_attention_heads=4,
                                          num_key_value_heads=2)),
     "model.layers.0.self_attn", "model.layers.0.mlp"),
])
def test_other_hf_families_resolve(build, attention: str, mlp: str) -> None:
    plan = resolve_tp_plan(build(), None)
    assert attention in plan.regions and mlp in plan.regions
    assert plan.embedding is not None and plan.head is not None


def test_mixtral_experts_stay_whole_and_attention_is_split() -> None:
    model = MixtralForCausalLM(MixtralConfig(**SMALL, num_attention_heads=4,
                                             num_key_value_heads=2, num_local_experts=4))
    plan = resolve_tp_plan(model, None)
    assert plan.kept_replicated == ("model.layers.0.mlp.experts", "model.layers.1.mlp.experts")
    assert not any(".experts" in name for name in plan.styles)
    assert plan.regions == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    with pytest.raises(ConfigError, match="sequence_parallel=False"):
        check_sequence_parallel(model, plan)


def test_wildcard_matches_one_path_component_only() -> None:
    expanded = expand_plan(CustomLM(), {"blocks.*.attn.q": "colwise"})
    assert sorted(expanded.modules) == ["blocks.0.attn.q", "blocks.1.attn.q"]
    with pytest.raises(ConfigError, match=r"matches no module.*blocks\.\*\.attn\.q"):
        expand_plan(CustomLM(), {"*.q": "colwise"})


def test_model_without_plan_is_told_what_to_pass() -> None:
    with pytest.raises(ConfigError) as error:
        resolve_tp_plan(CustomLM(), None)
    message = str(error.value)
    assert "transform(model, tp_plan={" in message
    assert "blocks.0.attn.q" in message  # shows the model's own linear layers


@pytest.mark.parametrize("plan, match", [
    ({"blocks.*.attn.q": "diagonal"}, "not a style meshtrain translates"),
    ({"blocks.*.ln1": "colwise"}, "needs an nn.Linear"),
    ({"blocks.*.attn.q.weight": "colwise"}, "names parameters"),
    ({}, "tp_plan is empty"),
])
def test_bad_user_plans(plan: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        resolve_tp_plan(CustomLM(), plan)


def test_user_plan_styles_and_regions() -> None:
    plan = resolve_tp_plan(CustomLM(), CUSTOM_PLAN)
    assert plan.styles["embed"] == "embedding_rowwise"  # 'rowwise' on an nn.Embedding
    assert plan.head == "head"
    assert plan.regions == ("blocks.0.attn", "blocks.0.ff", "blocks.1.attn", "blocks.1.ff")


@pytest.mark.parametrize("heads, kv_heads, degree, fragment", [
    (8, 4, 8, "num_key_value_heads=4: 4 / 8 = 0.5 heads per tp rank"),
    (6, 6, 4, "num_attention_heads=6: 6 / 4 = 1.5 heads per tp rank"),
])
def test_heads_not_divisible(heads: int, kv_heads: int, degree: int, fragment: str) -> None:
    model = llama(heads, kv_heads, hidden=48)
    with pytest.raises(ConfigError, match=fragment) as error:
        check_attention_heads(model, resolve_tp_plan(model, None), degree)
    valid = "1, 2 or 4" if (heads, kv_heads) == (8, 4) else "1, 2, 3 or 6"
    assert f"Use tensor_parallel_degree {valid}." in str(error.value)


def test_heads_divisible_passes() -> None:
    model = llama(8, 4)
    check_attention_heads(model, resolve_tp_plan(model, None), 4)


def test_custom_attention_head_attribute_is_checked() -> None:
    model = CustomLM(dim=48, num_heads=3)
    with pytest.raises(ConfigError, match=r"blocks\.\*\.attn\.num_heads=3: 3 / 2 = 1\.5"):
        check_attention_heads(model, resolve_tp_plan(model, CUSTOM_PLAN), 2)


def test_sequence_parallel_needs_embedding_and_head() -> None:
    plan = {k: v for k, v in CUSTOM_PLAN.items() if k != "head"}
    model = CustomLM()
    with pytest.raises(ConfigError, match="no output head"):
        check_sequence_parallel(model, resolve_tp_plan(model, plan))


def test_translation_to_torch_styles() -> None:
    model = llama()
    resolved = resolve_tp_plan(model, None)
    plain = build_parallelize_plan(model, resolved, sequence_parallel=False, loss_parallel=False)
    assert isinstance(plain["model.layers.0.self_attn.q_proj"], ColwiseParallel)
    down = plain["model.layers.0.mlp.down_proj"]
    assert isinstance(down, RowwiseParallel) and down.output_layouts == (Replicate(),)
    assert plain["lm_head"].output_layouts == (Replicate(),)
    assert isinstance(plain["model.layers.0.self_attn"], PrepareRegionInput)
    assert "model.norm" not in plain  # replicated by replicate_non_tp_parameters instead

    sp = build_parallelize_plan(model, resolved, sequence_parallel=True, loss_parallel=True)
    assert sp["model.layers.0.mlp.down_proj"].output_layouts == (Shard(1),)
    assert sp["model.embed_tokens"].output_layouts == (Shard(1),)
    assert sp["lm_head"].input_layouts == (Shard(1),)
    assert sp["lm_head"].output_layouts == (Shard(-1),) and not sp["lm_head"].use_local_output
    norms = [name for name, style in sp.items() if isinstance(style, SequenceParallel)]
    assert norms == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                     "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm",
                     "model.norm"]


def test_tp_seed_is_smp_seed_plus_rank() -> None:
    assert [tp_seed(1234, rank) for rank in range(3)] == [1234, 1235, 1236]


def test_region_seeds_are_distinct_and_repeatable() -> None:
    seeds = {region_seed(7, rank, region, step)
             for rank in range(4) for region in range(8) for step in range(16)}
    assert len(seeds) == 4 * 8 * 16
    assert region_seed(7, 1, 2, 3) == region_seed(7, 1, 2, 3)
    assert 0 <= region_seed(7, 1, 2, 3) < 2**63


def test_tp_is_applied_with_styles_and_hooks_not_patches(single_process_runtime) -> None:
    """A world of one (tp mesh of size 1): nothing is patched onto modules or parameters; the
    region's hooks fork the RNG (also when the region raises); the replicated parameters are
    listed beside the model."""
    import torch

    from meshtrain.contract.mesh_axes import MeshAxis
    from meshtrain_runtime.parallel.tensor import (
        apply_tensor_parallel,
        global_head_counts,
        locally_computed_parameters,
        stop_local_compute,
    )

    st = single_process_runtime.init()
    model = CustomLM(dropout=0.5)  # dropout only inside the attention regions
    apply_tensor_parallel(model, st.mesh[MeshAxis.TP], plan=CUSTOM_PLAN, random_seed=5)
    for name, module in model.named_modules():
        assert "forward" not in vars(module), name
        assert not [key for key in vars(module) if key.startswith("_meshtrain")], name
    assert not [p for p in model.parameters() if any(k.startswith("_meshtrain") for k in vars(p))]
    assert global_head_counts(model.blocks[0].attn) == {"num_heads": 4}

    model.train()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    before = torch.get_rng_state()
    model(ids)
    assert torch.equal(torch.get_rng_state(), before)  # region draws left the outer stream
    handle = model.blocks[0].attn.q.register_forward_pre_hook(_raise)
    with pytest.raises(RuntimeError, match="inside the region"):
        model(ids)
    handle.remove()
    assert torch.equal(torch.get_rng_state(), before)  # restored on the exception too

    local = {name: locally_computed_parameters(module) for name, module in model.named_modules()
             if locally_computed_parameters(module)}
    assert sorted(f"{m}.{p}" for m, names in local.items() for p in names) == sorted(
        model.meshtrain_tp.replicated_parameters
    )
    stop_local_compute(model.norm)
    assert locally_computed_parameters(model.norm) == ()
    model.to(torch.float64)  # swaps the DTensor parameters: nothing may hold a weakref to them
    assert model.embed.weight.dtype == torch.float64


def _raise(_module: nn.Module, _args: tuple) -> None:
    raise RuntimeError("inside the region")
