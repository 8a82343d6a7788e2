"""SMP's delayed parameter init through the script's FSDP1 call (a world of one process)."""

from __future__ import annotations

import functools

import pytest
import torch


@pytest.fixture
def tsm(single_process_runtime):
    from meshtrain_runtime.compat import smp

    yield smp
    smp.state.reset()


def test_meta_model_is_initialised_by_fsdp_param_init_fn(tsm):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import LlamaConfig, LlamaForCausalLM

    from meshtrain_runtime.compat.smp.delayed_param import DelayedParamIniter
    from meshtrain_runtime.compat.smp.tensor_parallel.transformer import TransformerLayer

    tsm.init({"hybrid_shard_degree": 1})
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                         initializer_range=0.02)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = tsm.transform(model)
    assert all(p.is_meta for p in model.parameters())  # SMP: a meta model stays on meta
    initer = DelayedParamIniter(model)
    assert initer.num_params == sum(p.numel() for p in model.parameters())
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={TransformerLayer})
    with initer.validate_params_and_buffers_inited():
        wrapped = FSDP(model, auto_wrap_policy=policy, use_orig_params=True,
                       param_init_fn=initer.get_param_init_fn(),
                       post_param_init_fn=initer.get_post_param_init_fn())
    assert len(FSDP.fsdp_modules(wrapped)) == 3  # two TransformerLayer blocks + the root
    with FSDP.summon_full_params(wrapped):
        q = model.model.layers[0].self_attn.q_proj.weight
        assert 0.015 < q.std().item() < 0.025  # HF _init_weights: normal(0, initializer_range)
        assert torch.equal(model.model.norm.weight, torch.ones(32))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    loss = wrapped(input_ids=ids, labels=ids).loss
    assert abs(loss.item() - torch.log(torch.tensor(64.0)).item()) < 0.5  # near-uniform logits


def test_validate_raises_when_fsdp_was_given_no_param_init_fn(tsm):
    from transformers import LlamaConfig, LlamaForCausalLM

    from meshtrain_runtime.compat.smp.delayed_param import DelayedParamIniter

    tsm.init({})
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1, num_attention_heads=4))
    initer = DelayedParamIniter(model)
    with (pytest.raises(AssertionError, match="still on the meta device"),
          initer.validate_params_and_buffers_inited()):
        pass
