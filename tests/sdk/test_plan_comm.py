"""Communication bytes per GPU per step: ring volumes, FSDP/HSDP/TP/EP, link bandwidths."""

from __future__ import annotations

import pytest

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan.cluster import build_cluster
from meshtrain.plan.comm import (
    all_gather_bytes,
    all_reduce_bytes,
    all_to_all_bytes,
    communication_volumes,
    group_bandwidth,
    reduce_scatter_bytes,
)
from meshtrain.plan.memory import Training
from meshtrain.plan.models import ModelSpec, llama_shaped

N = llama_shaped(8e9)  # exactly 8e9 parameters, one TP-splittable pool


def test_ring_volumes():
    assert all_reduce_bytes(4, 100) == 150       # 2 (n-1)/n M
    assert reduce_scatter_bytes(4, 100) == 75    # (n-1)/n M
    assert all_gather_bytes(4, 100) == 75
    assert all_to_all_bytes(8, 80) == 70
    assert all_reduce_bytes(1, 100) == reduce_scatter_bytes(1, 100) == 0


def _volumes(model, world, training=None, recompute=False, **parameters):
    degrees = resolve_degrees(SMPParameters(**parameters), world)
    return communication_volumes(model, degrees, training or Training(), recompute=recompute)


def test_full_shard_over_8():
    v = _volumes(N, 8, hybrid_shard_degree=8)
    assert v.fsdp_all_gather == 2 * 7 / 8 * 8e9 * 2      # bf16, forward and backward
    assert v.fsdp_reduce_scatter == 7 / 8 * 8e9 * 4       # fp32 gradients
    assert v.data_parallel_all_reduce == 0
    assert v.total == 28e9 + 28e9


def test_shard_grad_op_gathers_once():
    v = _volumes(N, 8, hybrid_shard_degree=8, sharding_strategy="shard_grad_op")
    assert v.fsdp_all_gather == 7 / 8 * 8e9 * 2


def test_hybrid_shard_4_by_2_replicas():
    v = _volumes(N, 8, hybrid_shard_degree=4)
    assert v.fsdp_all_gather == 2 * 3 / 4 * 8e9 * 2
    assert v.fsdp_reduce_scatter == 3 / 4 * 8e9 * 4
    assert v.data_parallel_all_reduce == 2 * 1 / 2 * (8e9 / 4 * 4)  # shards over 2 replicas


def test_no_shard_all_reduces_every_gradient():
    v = _volumes(N, 8, hybrid_shard_degree=1)
    assert v.fsdp_all_gather == v.fsdp_reduce_scatter == 0
    assert v.data_parallel_all_reduce == 2 * 7 / 8 * 8e9 * 4


LLAMA = ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=160, vocab_size=128)


def test_tensor_parallel_per_layer_all_reduces():
    fp32 = Training(seq_len=32, micro_batch=2, precision="fp32")
    v = _volumes(LLAMA, 2, fp32, hybrid_shard_degree=1, tensor_parallel_degree=2)
    message = 4 * 64 * 64  # fp32 x (b s) x h
    all_reduce = 2 * 1 / 2 * message
    per_layer = 4 * all_reduce             # 2 forward + 2 backward all-reduces
    logits = 1 / 2 * 4 * 64 * 128         # the head gathers its (b, s, V/t) logits
    head_grad = all_reduce                 # and all-reduces its input gradient
    embedding = all_reduce                 # the vocab-parallel embedding all-reduces its output
    # (the runtime's tp=2 run does 5 + 5 all-reduces and one logits gather: the calibration in
    # tests/runtime/test_plan_calibration_multiprocess.py)
    assert v.tensor_parallel == 2 * per_layer + logits + head_grad + embedding == 180_224
    degrees = resolve_degrees(SMPParameters(hybrid_shard_degree=1, tensor_parallel_degree=2), 2)
    sp = communication_volumes(LLAMA, degrees, fp32, sequence_parallel=True)
    # AG + RS move what an all-reduce moves; the 5 norm weights (2 per layer and the final one)
    # see a sequence shard each, so their gradients are all-reduced too
    norm_grads = 2 * 1 / 2 * 4 * 5 * 64
    assert sp.tensor_parallel == v.tensor_parallel + norm_grads
    split = communication_volumes(LLAMA, degrees, fp32, loss_parallel=True)
    # logits stay vocab-split; the cross entropy all-reduces 3 fp32 numbers per token (b s = 64)
    loss_numbers = 3 * (2 * 1 / 2 * 4 * 64)
    assert split.tensor_parallel == 2 * per_layer + head_grad + embedding + loss_numbers
    recomputed = _volumes(LLAMA, 2, fp32, recompute=True, hybrid_shard_degree=1,
                          tensor_parallel_degree=2)
    # torch's checkpoint stops once backward's last saved tensor is rebuilt: a recomputed layer
    # repeats the attention's all-reduce, not the MLP's (its output feeds only the residual add)
    ends = logits + head_grad + embedding
    assert recomputed.tensor_parallel == 2 * 5 * all_reduce + ends
    sp_recomputed = communication_volumes(LLAMA, degrees, fp32, recompute=True,
                                          sequence_parallel=True)
    # with sequence parallelism: both all-gathers and the attention's reduce-scatter
    assert sp_recomputed.tensor_parallel == 2 * (4 * all_reduce + 3 * message / 2) + ends \
        + norm_grads
    half = communication_volumes(LLAMA, degrees, fp32, recompute=0.5)
    assert half.tensor_parallel == 2 * 4.5 * all_reduce + ends  # every other layer


def test_expert_all_to_all():
    mixtral = ModelSpec(name="moe", family="mixtral", hidden_size=64, num_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                        vocab_size=128, num_experts=4, experts_per_token=2)
    v = _volumes(mixtral, 4, Training(seq_len=32, micro_batch=2), hybrid_shard_degree=4,
                 expert_parallel_degree=2)
    message = 2 * (64 * 2) * 64  # bf16 x routed tokens (b s k) x h
    assert v.expert_all_to_all == 2 * 4 * (1 / 2 * message)  # 2 layers x 4 all-to-alls
    assert v.tensor_parallel == 0


def test_group_bandwidth_inside_and_across_hosts():
    cluster = build_cluster(instance_type="ml.p4d.24xlarge", instance_count=4)
    assert group_bandwidth(cluster, 8, 1) == 300e9          # NVSwitch, one host
    assert group_bandwidth(cluster, 32, 1) == 50e9          # 400 Gbit/s per host
    assert group_bandwidth(cluster, 4, 8) == 50e9 / 8       # one rank per host, 8 rings share
    assert group_bandwidth(cluster, 8, 4) == 50e9 * 2 / 8   # two ranks per host
    assert group_bandwidth(cluster, 1, 1) == pytest.approx(float("inf"))
