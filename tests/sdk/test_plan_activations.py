"""Activation bytes: Korthikanti et al. 2022's closed forms and HF layers, by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtrain import ConfigError
from meshtrain.plan.activations import activation_bytes, korthikanti_layer_bytes
from meshtrain.plan.models import ModelSpec

GPT3 = ModelSpec(name="gpt3-175b", family="gpt", hidden_size=12288, num_layers=96,
                 num_attention_heads=96, num_key_value_heads=96, intermediate_size=4 * 12288,
                 vocab_size=51200, max_position_embeddings=2048)
SBH = 2048 * 12288  # s = 2048, b = 1, h = 12288; 5as/h = 5 * 96 * 2048 / 12288 = 80


@pytest.mark.parametrize(("tp", "sp", "recompute", "expected"), [
    (1, False, "none", SBH * (34 + 80)),             # sbh (34 + 5as/h) = 2,868,903,936
    (8, False, "none", SBH * (10 + 24 / 8 + 80 / 8)),  # sbh (10 + 24/t + 5as/(ht))
    (8, True, "none", SBH / 8 * (34 + 80)),          # sbh/t (34 + 5as/h)
    (8, True, "selective", SBH / 8 * 34),            # 34 sbh / t
    (1, False, "selective", SBH * 34),
])
def test_gpt3_layer_matches_the_paper(tp, sp, recompute, expected):
    estimate = activation_bytes(GPT3, seq_len=2048, micro_batch=1, precision="fp16",
                                tensor_parallel_degree=tp, sequence_parallel=sp,
                                recompute=recompute)
    assert estimate.layer_bytes == pytest.approx(expected, rel=1e-12)
    assert SBH * (34 + 80) == 2_868_903_936


def test_full_recomputation_keeps_2sbh_per_layer():
    full = activation_bytes(GPT3, seq_len=2048, micro_batch=1, precision="fp16",
                            recompute="full")
    assert full.checkpoint_bytes == 2 * SBH
    assert full.num_checkpointed == 96
    with_sp = activation_bytes(GPT3, seq_len=2048, micro_batch=1, precision="fp16",
                               tensor_parallel_degree=8, sequence_parallel=True,
                               recompute="full")
    assert with_sp.checkpoint_bytes == 2 * SBH / 8


@settings(max_examples=80, deadline=None)
@given(s=st.sampled_from([128, 512, 2048, 4096]), b=st.integers(1, 8),
       heads=st.sampled_from([8, 16, 32, 64]), head_dim=st.sampled_from([64, 128]),
       tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans(),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_gpt_terms_sum_to_the_closed_forms(s, b, heads, head_dim, tp, sp, recompute):
    h = heads * head_dim
    model = ModelSpec(name="gpt", family="gpt", hidden_size=h, num_layers=2,
                      num_attention_heads=heads, num_key_value_heads=heads,
                      intermediate_size=4 * h, vocab_size=1000)
    estimate = activation_bytes(model, seq_len=s, micro_batch=b, precision="bf16",
                                tensor_parallel_degree=tp, sequence_parallel=sp,
                                recompute=recompute)
    kept = estimate.checkpoint_bytes if recompute == "full" else estimate.layer_bytes
    assert kept == pytest.approx(korthikanti_layer_bytes(
        seq_len=s, micro_batch=b, hidden_size=h, num_heads=heads, tensor_parallel_degree=tp,
        sequence_parallel=sp, recompute=recompute), rel=1e-12)


LLAMA = ModelSpec(name="tiny", hidden_size=64, num_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=160, vocab_size=128)
# b = 2, s = 32: T = 64 tokens, T h = 4096, head dim 16, key/value width 32.


def test_hf_llama_layer_fp32_by_hand():
    # RMSNorm x2: fp32 input 4*4096 + rsqrt 4*64 + normalised 4*4096       = 2 x 33,024
    # q/k/v and gate/up inputs (the norms' outputs): 2 x 4*4096           = 32,768
    # q 4*64*64 + k, v 2 x 4*64*32 (GQA) + output 4*64*64 + lse 4*2*4*32  = 50,176
    # SwiGLU: gate, silu, up, product 4 x 4*64*160                        = 163,840
    estimate = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="fp32")
    assert estimate.layer_bytes == 66_048 + 32_768 + 50_176 + 163_840 == 312_832
    # once per model: ids 8*64, rope cos/sin 2 x 4*32*16, final norm 33,024, head input
    # 4*4096, fp32 log-softmax 4*64*128, labels 8*64, loss 4
    assert sum(estimate.model_terms.values()) == 512 + 4096 + 33_024 + 16_384 + 32_768 + 516


def test_hf_llama_layer_bf16_by_hand():
    # norms 2 x (4*4096 + 256 + 2*4096); inputs 2 x 2*4096; q 8192 + k, v 8192 + out 8192 +
    # lse 1024 (fp32); SwiGLU 4 x 2*64*160
    estimate = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="bf16")
    assert estimate.layer_bytes == 49_664 + 16_384 + 25_600 + 81_920 == 173_568


def test_hf_llama_tensor_sequence_and_context_parallel_by_hand():
    tp2 = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="fp32",
                           tensor_parallel_degree=2)
    # heads and the intermediate dim halve; norms and the gathered inputs stay whole
    assert tp2.layer_bytes == 66_048 + 32_768 + (8192 + 8192 + 8192 + 512) + 81_920 == 205_824
    sp = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="fp32",
                          tensor_parallel_degree=2, sequence_parallel=True)
    assert sp.layer_bytes == 205_824 - 33_024  # norms on a sequence shard
    cp = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="fp32",
                          context_parallel_degree=2)
    # half of every term, plus the cp attention's output copied for o_proj (q: 4 x 32 x 64)
    assert cp.layer_bytes == 312_832 / 2 + 8192
    assert tp2.model_terms["logits_fp32"] == 4 * 64 * 128  # gathered by HF's head
    split = activation_bytes(LLAMA, seq_len=32, micro_batch=2, precision="fp32",
                             tensor_parallel_degree=2, loss_parallel=True)
    assert split.model_terms["logits_fp32"] == 4 * 64 * 128 / 2


def test_eager_attention_and_selective_recomputation_by_hand():
    eager = activation_bytes(LLAMA.model_copy(update={"attention": "eager"}), seq_len=32,
                             micro_batch=2, precision="fp32")
    # q, k and v repeated to 4 heads, fp32 softmax 4*2*4*32*32, output copy: no lse
    attention = 3 * 16_384 + 32_768 + 16_384
    assert eager.layer_bytes == 312_832 - 50_176 + attention == 360_960
    selective = activation_bytes(LLAMA.model_copy(update={"attention": "eager"}), seq_len=32,
                                 micro_batch=2, precision="fp32", recompute="selective")
    assert selective.layer_bytes == 360_960 - 32_768


def test_checkpoint_interval_and_offloading():
    model = LLAMA.model_copy(update={"num_layers": 32})
    every_4th = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32",
                                 recompute="full", checkpoint_interval=4)
    assert (every_4th.num_checkpointed, every_4th.num_checkpoints_on_gpu) == (8, 8)
    model_terms = sum(every_4th.model_terms.values())
    assert every_4th.total_bytes == 24 * 312_832 + 8 * 4 * 4096 + model_terms
    offloaded = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32",
                                 recompute="full", offload=True, loading_horizon=2)
    assert offloaded.num_checkpoints_on_gpu == 2
    assert offloaded.total_bytes == 2 * 4 * 4096 + model_terms
    assert offloaded.recompute_working_bytes == 312_832


def test_bad_arguments():
    with pytest.raises(ConfigError, match="not divisible by context_parallel_degree"):
        activation_bytes(LLAMA, seq_len=33, micro_batch=1, context_parallel_degree=2)
    with pytest.raises(ConfigError, match="precision"):
        activation_bytes(LLAMA, seq_len=32, micro_batch=1, precision="int4")


def test_op_level_selective_keeps_matmul_and_attention_outputs_by_hand():
    """recompute="op" (the runtime's activation_checkpointing: "selective"), the tiny Llama in
    fp32 (T = 64 tokens, h 64, head dim 16, key/value width 32, intermediate 160): a layer
    keeps its input and q (4*4096), k and v (4*2048 each), SDPA's output (4*4096) and
    log-sum-exp (4*2*4*32), o_proj's and down_proj's outputs (4*4096 each), gate and up
    (4*64*160 each)."""
    model = LLAMA.model_copy(update={"num_layers": 4})
    op = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32", recompute="op")
    assert op.kept_terms == {"kept_qk": 16_384 + 8192, "kept_v": 8192,
                             "kept_attention": 16_384 + 1024,
                             "kept_attention_output": 16_384, "kept_mlp": 2 * 40_960,
                             "kept_mlp_output": 16_384}
    kept = 24_576 + 8192 + 17_408 + 16_384 + 81_920 + 16_384
    assert op.kept_bytes == kept == 164_864
    assert op.total_bytes == 4 * (4 * 4096 + kept) + sum(op.model_terms.values())
    # backward: the layer's full activations again; the kept outputs are part of them or were
    # freed by the recompute, but down_proj's, which the stopped recompute never reads
    assert op.recompute_working_bytes == 312_832 - kept + 16_384
    # forward: the running MLP's activation and product on top of the kept gate and up
    assert op.running_bytes == 163_840 - 81_920
    full = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32",
                            recompute="full")
    none = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32")
    assert full.total_bytes < op.total_bytes < none.total_bytes
    offloaded = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32",
                                 recompute="op", offload=True, loading_horizon=1)
    # offloading moves the inputs only; the kept outputs stay on the device
    assert offloaded.total_bytes == op.total_bytes - 3 * 4 * 4096
    assert offloaded.forward_bytes == op.total_bytes - 4 * 4 * 4096


def test_op_level_selective_under_tp_sp_and_eager_attention():
    model = LLAMA.model_copy(update={"num_layers": 2})
    sp = activation_bytes(model, seq_len=32, micro_batch=2, precision="fp32", recompute="op",
                          tensor_parallel_degree=2, sequence_parallel=True)
    # each tp rank: half the heads and intermediate; a row-wise projection's matmul output is
    # the whole width (a partial sum) plus its reduce-scatter's half
    assert sp.kept_terms["kept_attention_output"] == 16_384 * 1.5
    assert sp.kept_terms["kept_mlp"] == 40_960
    eager = activation_bytes(model.model_copy(update={"attention": "eager"}), seq_len=32,
                             micro_batch=2, precision="fp32", recompute="op")
    assert "kept_attention" not in eager.kept_terms  # the score matmuls are recomputed


def test_op_level_selective_is_refused_for_encoder_decoders():
    from meshtrain.plan import PRESETS

    with pytest.raises(ConfigError, match="decoder-only") as error:
        activation_bytes(PRESETS["t5-3b"], seq_len=64, micro_batch=1, recompute="op")
    assert str(error.value).endswith("True or False.")
