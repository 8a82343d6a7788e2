"""FSDP-layer pieces without a process group: blocks, embedding/head, policies, data, clip."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from transformers import LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
from workers.hsdp_support import Block, TinyLM, build_llama, llama_config

from meshtrain.errors import ConfigError
from meshtrain_runtime.data import build_sampler, shard_dataset
from meshtrain_runtime.grad import clip_grad_norm_, total_grad_norm
from meshtrain_runtime.parallel.blocks import find_blocks
from meshtrain_runtime.parallel.fsdp import (
    find_embedding_and_head,
    resolve_mixed_precision,
    resolve_offload_policy,
)

# --- block discovery ---


def test_hf_blocks_come_from_no_split_modules() -> None:
    model = build_llama()
    assert find_blocks(model) == list(model.model.layers)


def test_moe_experts_are_not_blocks_of_their_own() -> None:
    config = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                           num_local_experts=4)
    model = MixtralForCausalLM(config)
    assert [type(b).__name__ for b in find_blocks(model)] == ["MixtralDecoderLayer"] * 2


def test_custom_blocks_are_repeated_module_list_children() -> None:
    model = TinyLM()
    assert find_blocks(model) == list(model.layers)


def test_nested_and_mixed_module_lists() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stages = nn.ModuleList(
                nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])) for _ in range(2)
            )
            self.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])  # not repeated

    model = Outer()
    assert find_blocks(model) == list(model.stages)  # outermost only; the mixed list is skipped


def test_model_without_blocks() -> None:
    assert find_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_explicit_blocks() -> None:
    model = TinyLM()
    assert find_blocks(model, Block) == list(model.layers)
    assert find_blocks(model, [model.layers[1], model.layers[0]]) == [
        model.layers[0], model.layers[1]
    ]
    with pytest.raises(ConfigError, match="no submodule of that class"):
        find_blocks(model, nn.Conv1d)
    with pytest.raises(ConfigError, match=r"blocks\[0\] \(Linear\) is not a submodule"):
        find_blocks(model, [nn.Linear(2, 2)])
    with pytest.raises(ConfigError, match="same module twice"):
        find_blocks(model, [model.layers[0], model.layers[0]])


# --- embeddings and output head (torchtitan's grouping) ---


def test_hf_embedding_and_head_get_their_own_groups() -> None:
    model = build_llama()
    embedding, head = find_embedding_and_head(model, find_blocks(model))
    assert embedding is model.model.embed_tokens and head is model.lm_head


def test_tied_embeddings_stay_in_the_root_group() -> None:
    config = llama_config()
    config.tie_word_embeddings = True
    model = LlamaForCausalLM(config)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert find_embedding_and_head(model, find_blocks(model)) == (None, None)


def test_custom_model_has_no_hf_getters() -> None:
    model = TinyLM()
    assert find_embedding_and_head(model, find_blocks(model)) == (None, None)


# --- policies ---


def test_mixed_precision_policies() -> None:
    bf16 = resolve_mixed_precision("bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp16 = resolve_mixed_precision("fp16")
    assert (fp16.param_dtype, fp16.reduce_dtype) == (torch.float16, torch.float32)
    assert resolve_mixed_precision("fp32") == MixedPrecisionPolicy()
    assert resolve_mixed_precision(None) == MixedPrecisionPolicy()
    with pytest.raises(ConfigError, match="'bf16', 'fp16', 'fp32' or None"):
        resolve_mixed_precision("int8")


def test_offload_policy() -> None:
    assert isinstance(resolve_offload_policy(True, "cuda"), CPUOffloadPolicy)
    assert type(resolve_offload_policy(False, "cpu")) is OffloadPolicy
    with pytest.raises(ConfigError, match="nothing to offload from"):
        resolve_offload_policy(True, "cpu")


# --- data sharding ---


def test_shard_dataset_rebuilds_the_global_batches() -> None:
    data = list(range(20))
    shards = [shard_dataset(data, dp_rank=r, dp_size=4) for r in range(4)]
    assert [list(s) for s in shards] == [[0, 4, 8, 12, 16], [1, 5, 9, 13, 17],
                                         [2, 6, 10, 14, 18], [3, 7, 11, 15, 19]]
    # per-rank batch 2 -> step k's union is samples [8k, 8k + 8)
    step1 = sorted(x for s in shards for x in list(s)[2:4])
    assert step1 == list(range(8, 16))


def test_shard_dataset_drops_the_tail_evenly() -> None:
    sizes = [len(shard_dataset(list(range(10)), dp_rank=r, dp_size=4)) for r in range(4)]
    assert sizes == [2, 2, 2, 2]
    padded = [len(shard_dataset(list(range(10)), dp_rank=r, dp_size=4, drop_last=False))
              for r in range(4)]
    assert padded == [3, 3, 3, 3]


def test_sampler_and_bad_coordinates() -> None:
    sampler = build_sampler(list(range(8)), dp_rank=1, dp_size=2, shuffle=False)
    assert list(sampler) == [1, 3, 5, 7]
    with pytest.raises(ConfigError, match=r"dp_rank=2 must lie in \[0, dp_size=2\)"):
        build_sampler(list(range(8)), dp_rank=2, dp_size=2)


# --- clip_grad_norm_ on plain tensors (DTensor cases run on real ranks) ---


@pytest.mark.parametrize("norm_type", [1.0, 2.0, float("inf")])
def test_clip_matches_torch_on_plain_tensors(norm_type: float) -> None:
    torch.manual_seed(0)
    ours, theirs = TinyLM(), TinyLM()
    ours(torch.randint(0, 128, (2, 8))).square().mean().backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        b.grad = a.grad.clone()
    norm = clip_grad_norm_(ours, 0.1, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.1, norm_type)
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_total_norm_edge_cases() -> None:
    assert float(total_grad_norm([])) == 0.0
    with pytest.raises(RuntimeError, match="non-finite"):
        total_grad_norm([torch.tensor([float("nan")])], error_if_nonfinite=True)
