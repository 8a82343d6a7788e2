"""Model shapes: presets, HF config.json loading, the parameter inventory, instance table."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
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

from meshtrain import ConfigError
from meshtrain.instances import (
    gpu_memory_gib,
    gpus_per_instance,
    instance_spec,
    known_instance_types,
)
from meshtrain.plan.models import (
    PRESETS,
    from_hf_config,
    llama_shaped,
    load_hf_config,
    param_groups,
    resolve_model,
)

# Parameter counts published for each checkpoint (Hugging Face model cards / safetensors index).
PUBLISHED_COUNTS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "gpt-neox-20b": 20_554_567_680,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_COUNTS))
def test_preset_parameter_counts_match_published(name):
    assert PRESETS[name].num_params == PUBLISHED_COUNTS[name]


def test_llama2_7b_count_by_hand():
    # embeddings 2 x 32000 x 4096; per layer 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096; final norm
    per_layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert PRESETS["llama2-7b"].num_params == 2 * 32000 * 4096 + 32 * per_layer + 4096


_SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 128}
TINY = [
    (LlamaConfig(**_SMALL, intermediate_size=160, tie_word_embeddings=False), LlamaForCausalLM),
    (LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=8,
                 num_key_value_heads=8, vocab_size=96, attention_bias=True, mlp_bias=True,
                 tie_word_embeddings=True), LlamaForCausalLM),
    (Qwen2Config(**_SMALL, intermediate_size=128, tie_word_embeddings=False), Qwen2ForCausalLM),
    (MixtralConfig(**_SMALL, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2),
     MixtralForCausalLM),
    (GPTNeoXConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=128), GPTNeoXForCausalLM),
]


@pytest.mark.parametrize(("config", "cls"), TINY, ids=lambda x: type(x).__name__)
def test_inventory_matches_real_hf_model(config, cls):
    """Same multiset of parameter shapes as the real model (tied weights counted once)."""
    with torch.device("meta"):
        model = cls(config)
    real = Counter(tuple(p.shape) for p in model.parameters())
    spec = from_hf_config(config.to_dict())
    planned: Counter = Counter()
    for group in param_groups(spec):
        planned[group.shape] += group.count
    assert planned == real
    assert spec.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["llama2-70b", "mixtral-8x7b", "gpt-neox-20b"])
def test_full_size_presets_match_hf_models_on_meta(name):
    spec = PRESETS[name]
    common = {"hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
              "num_attention_heads": spec.num_attention_heads,
              "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size,
              "tie_word_embeddings": False}
    if spec.family == "gpt_neox":
        config, cls = GPTNeoXConfig(**common), GPTNeoXForCausalLM
    elif spec.family == "mixtral":
        config, cls = MixtralConfig(**common, num_key_value_heads=spec.num_key_value_heads,
                                    num_local_experts=8, num_experts_per_tok=2), MixtralForCausalLM
    else:
        config, cls = LlamaConfig(**common, num_key_value_heads=spec.num_key_value_heads), \
            LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params


def test_load_config_json_file_and_directory(tmp_path):
    config = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=3,
                         num_attention_heads=8, num_key_value_heads=4, vocab_size=1000)
    config.save_pretrained(tmp_path)
    for path in (tmp_path, tmp_path / "config.json"):
        spec = load_hf_config(path)
        assert (spec.hidden_size, spec.num_layers, spec.num_attention_heads,
                spec.num_key_value_heads, spec.intermediate_size, spec.vocab_size) == (
            128, 3, 8, 4, 344, 1000)
        assert spec.source == "config.json"
    assert resolve_model(str(tmp_path)).hidden_size == 128


def test_neox_rotary_fraction_from_transformers5_rope_parameters():
    spec = from_hf_config(GPTNeoXConfig(hidden_size=64, num_attention_heads=4,
                                        intermediate_size=256, vocab_size=128).to_dict())
    assert spec.rotary_dim == 4  # head dim 16 x partial_rotary_factor 0.25


def test_llama_shaped_keeps_the_given_count():
    spec = llama_shaped(7e9)
    assert spec.num_params == 7_000_000_000
    assert spec.hidden_size % 128 == 0
    assert spec.num_attention_heads * 128 == spec.hidden_size
    synthesized = spec.model_copy(update={"declared_num_params": None}).num_params
    assert abs(synthesized / 7e9 - 1) < 0.05


@pytest.mark.parametrize(("model", "needle"), [
    ("llama2-7", "Did you mean 'llama2-7b'"),
    ({"model_type": "t5", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
      "intermediate_size": 8, "vocab_size": 8}, "model_type 't5'"),
    ({"model_type": "llama", "hidden_size": 8}, "lacks 'num_attention_heads'"),
    ({"model_type": "llama", "hidden_size": 10, "num_hidden_layers": 1, "num_attention_heads": 3,
      "intermediate_size": 8, "vocab_size": 8}, "not a multiple of num_attention_heads"),
])
def test_bad_models_are_config_errors(model, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve_model(model)


def test_bad_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="Cannot parse"):
        load_hf_config(path)
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="JSON object"):
        load_hf_config(path)


@pytest.mark.parametrize(("instance_type", "gpus", "memory"), [
    ("ml.p4d.24xlarge", 8, 40.0), ("ml.p4de.24xlarge", 8, 80.0),
    ("ml.p5.48xlarge", 8, 81559 / 1024), ("ml.g5.xlarge", 1, 23028 / 1024),
    ("ml.g5.12xlarge", 4, 23028 / 1024), ("ml.g5.48xlarge", 8, 23028 / 1024),
    ("ml.p3.2xlarge", 1, 16160 / 1024), ("ml.p3.16xlarge", 8, 16160 / 1024),
    ("ml.m5.xlarge", 0, 0.0), ("ml.c5.18xlarge", 0, 0.0), ("local", 0, 0.0),
])
def test_instance_table(instance_type, gpus, memory):
    assert gpus_per_instance(instance_type) == gpus
    assert gpu_memory_gib(instance_type) == pytest.approx(memory)


def test_unknown_instance_type_suggests_a_close_name():
    with pytest.raises(ConfigError, match=r"Did you mean 'ml\.p4d\.24xlarge'"):
        gpus_per_instance("ml.p4d.24xlarg")
    assert "ml.p5.48xlarge" in known_instance_types()
    assert instance_spec("ml.p5.48xlarge").network_gbit_per_s == 3200
