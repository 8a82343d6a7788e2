"""The planner's context parallelism: attention bytes per cp_comm_type, activations divided by
cp in every phase, the refusals before launch, the longest sequence a layout fits, and the CLI.

Every number is derived by hand in the test from the module docstring of meshtrain.plan.context
(no launches; benchmarks/bench_context.py measures the bytes the runtime's collectives move).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io

import pytest

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.contract.errors import ConfigError
from meshtrain.plan import build_cluster, estimate_layout, plan_layouts, preflight
from meshtrain.plan.activations import activation_bytes
from meshtrain.plan.cli import plan_main
from meshtrain.plan.comm import communication_volumes
from meshtrain.plan.context import context_layer_bytes, max_seq_len
from meshtrain.plan.layouts import longest_sequence
from meshtrain.plan.memory import Training
from meshtrain.plan.models import ModelSpec
from meshtrain.plan.report import longest_by_context_degree

# 4 heads of 16, 2 key/value heads (GQA), 2 layers
TINY = ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=256)
# cp 4 over 64 tokens: a rank holds n = 16; bf16: K = 2*16*2*16 = 1024 bytes (k or v),
# Q = 2*16*4*16 = 2048 (q or the output); gradients of k, v in fp32: G = 4*16*2*16 = 2048
K, Q, G = 1024, 2048, 2048


def layer(comm_type: str, *, cp: int = 4, compute_bytes: int = 2, tp: int = 1):
    return context_layer_bytes(TINY, cp=cp, tokens=64 // cp, compute_bytes=compute_bytes,
                               tensor_parallel_degree=tp, comm_type=comm_type)


def test_ring_p2p_bytes_by_hand():
    ring = layer("p2p")
    assert ring.forward == 3 * 2 * K == 6144  # k, v of 3/4 of the sequence pass each rank
    assert ring.backward == 3 * 2 * K + 4 * 2 * G == 22_528  # k, v again; dk, dv: cp hops


def test_all_gather_bytes_by_hand():
    gather = layer("all_gather")
    assert gather.forward == 3 / 4 * (4 * 2 * K) == 6144  # all-gather of the whole k, v
    # gathered again in backward (nothing kept), then dk, dv reduce-scattered in fp32
    assert gather.backward == 3 / 4 * (4 * 2 * K) + 3 / 4 * (4 * 2 * G) == 18_432


def test_a2a_bytes_by_hand():
    # cp 2 (32 tokens a rank: K = 2048, Q = 4096): 4 all-to-alls of half of the rank's q, k, v
    # and output, each way
    ulysses = layer("a2a", cp=2)
    assert ulysses.forward == ulysses.backward == 1 / 2 * (4096 + 2048 + 2048 + 4096) == 6144
    # cp 4: 2 key/value heads do not split over 4 ranks: repeated to the 4 heads first (a plain
    # module; the runtime refuses it for HF models), so k and v move as much as q: 3/4 of 4 Q
    assert layer("a2a").forward == 3 / 4 * (4 * Q) == 6144
    wide = TINY.model_copy(update={"num_key_value_heads": 4})
    assert context_layer_bytes(wide, cp=4, tokens=16, compute_bytes=2, comm_type="a2a").forward \
        == 3 / 4 * (Q + 2 * 2048 + Q) == 6144  # 4 key/value heads of 16 tokens: 2048 bytes
    # tp 2 leaves a rank 1 key/value head for 2 cp ranks: k and v are repeated to its 2 heads
    # first (as the runtime does), so they move as much as q (2*32*2*16 = 2048 each)
    assert layer("a2a", cp=2, tp=2).forward == 1 / 2 * (4 * 2048) == 4096
    assert layer("p2p", cp=2, tp=2).forward == 2 * 2 * 32 * 1 * 16  # no repeat for the ring


def test_fp32_gradients_are_the_compute_dtype_and_tp_divides_heads():
    assert layer("p2p", compute_bytes=4).backward == 3 * 2 * 2048 + 4 * 2 * 2048
    assert layer("all_gather", tp=2).forward == 3 * 2 * K / 2
    assert layer("p2p", cp=1) == layer("a2a", cp=1) == context_layer_bytes(
        TINY, cp=1, tokens=64, compute_bytes=2)
    assert layer("p2p", cp=1).forward == 0


@pytest.mark.parametrize(("comm_type", "cp", "forward", "backward"),
                         [("p2p", 4, 6144, 22_528), ("all_gather", 4, 6144, 18_432),
                          ("a2a", 4, 6144, 6144), ("p2p", 2, 4096, 4096 + 4 * 4096),
                          ("a2a", 2, 6144, 6144)])
def test_step_volume_counts_every_layer_and_recompute(comm_type, cp, forward, backward):
    degrees = resolve_degrees(SMPParameters(context_parallel_degree=cp), 4)
    training = Training(seq_len=64, micro_batch=1, precision="bf16")
    plain = communication_volumes(TINY, degrees, training, cp_comm_type=comm_type)
    assert plain.context_parallel == 2 * (forward + backward)
    recomputed = communication_volumes(TINY, degrees, training, recompute=True,
                                       cp_comm_type=comm_type)
    assert recomputed.context_parallel == 2 * (2 * forward + backward)  # forward runs twice


def _cp(cp: int, comm_type: str = "p2p", **extra) -> SMPParameters:
    return SMPParameters(context_parallel_degree=cp, cp_comm_type=comm_type, **extra)


def test_layout_reads_cp_comm_type_from_the_parameters():
    cluster = build_cluster(gpus=4, gpu_memory_gib=80)
    training = Training(seq_len=64, precision="bf16")
    for comm_type, cp, forward, backward in (("p2p", 4, 6144, 22_528), ("a2a", 2, 6144, 6144)):
        estimate = estimate_layout(TINY, _cp(cp, comm_type), cluster, training)
        assert estimate.comm.context_parallel == 2 * (forward + backward)
        assert estimate.layout["cp_comm_type"] == comm_type  # the distribution asks for it


def test_activations_divided_by_cp_in_every_phase():
    cluster = build_cluster(gpus=4, gpu_memory_gib=80)
    training = Training(seq_len=64, precision="fp32")
    one, two = (estimate_layout(TINY, SMPParameters(hybrid_shard_degree=4,
                                                    context_parallel_degree=cp), cluster,
                                training) for cp in (1, 2))
    # per layer at 32 local tokens, fp32: norms 2 x (4*32*64 + 4*32 + 4*32*64) = 33_024;
    # projection inputs 2 x 4*32*64 = 16_384; SwiGLU 4 x 4*32*128 = 65_536; attention: q 8192
    # + k, v 2 x 4096, the output twice (saved by the cp attention, copied for o_proj) 16_384,
    # lse 4*4*32 = 512
    assert two.activations.layer_bytes == 33_024 + 16_384 + 65_536 + 8192 + 8192 + 16_384 + 512
    for key in ("norms", "projection_inputs", "mlp", "attention_lse"):
        assert two.activations.layer_terms[key] == one.activations.layer_terms[key] / 2
    assert two.activations.layer_terms["attention_out"] == one.activations.layer_terms[
        "attention_out"]  # half the tokens, two copies
    assert two.activations.model_terms["logits_fp32"] == 4 * 32 * 256
    phases = {p.name: p.terms for p in two.memory.phases}
    phases_1 = {p.name: p.terms for p in one.memory.phases}
    # the loss's fp32 logits and the backward's flowing gradient are per local token
    assert phases["loss"]["loss_temporaries"] == phases_1["loss"]["loss_temporaries"] / 2
    assert phases["backward"]["gradient_flow"] == phases_1["backward"]["gradient_flow"] / 2
    # model states do not depend on cp: the cp ranks are part of the sharding group
    assert phases["optimizer_step"] == phases_1["optimizer_step"]


def test_eager_attention_under_cp_keeps_no_scores():
    eager = TINY.model_copy(update={"attention": "eager"})
    kwargs = {"seq_len": 64, "micro_batch": 1, "precision": "fp32", "context_parallel_degree": 2}
    assert activation_bytes(eager, **kwargs).layer_terms == activation_bytes(
        TINY, **kwargs).layer_terms  # the cp attention replaces eager: no s x s softmax
    assert "attention_scores" not in activation_bytes(eager, **kwargs).layer_terms
    gpt = ModelSpec(name="paper", family="gpt", hidden_size=64, num_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=256,
                    vocab_size=256)
    split = activation_bytes(gpt, **kwargs).layer_terms["attention_scores"]
    # the paper's unfused layer: local queries (32) against the whole sequence's keys (64)
    assert split == (4 + 1 + 4) * 1 * 4 * 32 * 64


def test_refusals_before_launch_with_the_arithmetic():
    cluster = build_cluster(gpus=8, gpu_memory_gib=80)
    with pytest.raises(ConfigError, match=r"seq_len=60 is not divisible by 2 x "
                                          r"context_parallel_degree = 8.*56 or 64"):
        estimate_layout(TINY, _cp(4), cluster, Training(seq_len=60))
    six = TINY.model_copy(update={"num_attention_heads": 8, "num_key_value_heads": 2,
                                  "head_dim": 8})
    with pytest.raises(ConfigError, match=r"'a2a'.*num_key_value_heads = 2 is not divisible "
                                          r"by 4 \(2 % 4 = 2\)"):
        estimate_layout(six, _cp(4, "a2a"), cluster, Training(seq_len=64))
    with pytest.raises(ConfigError, match=r"num_attention_heads / tensor_parallel_degree 2 = 2 "
                                          r"is not divisible by 4"):
        estimate_layout(TINY.model_copy(update={"num_key_value_heads": 4}),
                        SMPParameters(context_parallel_degree=4, tensor_parallel_degree=2,
                                      hybrid_shard_degree=4, cp_comm_type="a2a"),
                        cluster, Training(seq_len=64))
    assert estimate_layout(six, _cp(4, "p2p"), cluster, Training(seq_len=64)).fits
    # the Estimator's pre-flight refuses it too, before anything is launched
    with pytest.raises(ConfigError, match="not divisible by 2 x context_parallel_degree"):
        preflight({"torch_distributed": {"enabled": True},
                   "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                       "context_parallel_degree": 2}}}},
                  model=TINY, instance_type="ml.p4d.24xlarge", seq_len=66)


def test_max_seq_len_search():
    def under(limit):
        return lambda seq_len: seq_len <= limit

    assert max_seq_len(under(1003), cp=4) == 1000  # the largest multiple of 8
    assert max_seq_len(under(1003), cp=1) == 1003
    assert max_seq_len(under(7), cp=4) == 0
    assert max_seq_len(lambda seq_len: None, cp=2) is None
    assert max_seq_len(under(10 ** 9), cp=1, limit=4096) == 4096


def test_longest_sequence_of_a_layout_is_the_boundary():
    model = ModelSpec(name="mid", hidden_size=4096, num_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14_336, vocab_size=128_256)
    cluster = build_cluster(gpus=8, gpu_memory_gib=80)
    training = Training(seq_len=8192)
    lengths = {}
    for cp in (1, 2, 4):
        parameters = SMPParameters(context_parallel_degree=cp)
        longest = longest_sequence(model, parameters, cluster, training)
        assert longest % (2 * cp if cp > 1 else 1) == 0
        at = dataclasses.replace(training, seq_len=longest)
        beyond = dataclasses.replace(training, seq_len=longest + (2 * cp if cp > 1 else 1))
        assert estimate_layout(model, parameters, cluster, at).fits
        assert not estimate_layout(model, parameters, cluster, beyond).fits
        lengths[cp] = longest
    assert lengths[1] < lengths[2] < lengths[4]  # a longer sequence per rank with more cp
    assert longest_sequence(model, SMPParameters(), build_cluster(gpus=8), training) \
        == lengths[1]  # 80 GiB by default: the same


def test_plan_ranks_cp_layouts_with_the_others():
    model = ModelSpec(name="mid", hidden_size=4096, num_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14_336, vocab_size=128_256)
    plan = plan_layouts(model, build_cluster(gpus=8, gpu_memory_gib=80),
                        Training(seq_len=131_072), cp_comm_type="all_gather")
    cps = {c.degrees.context_parallel_degree for c in plan.candidates}
    assert cps == {1, 2, 4, 8}
    assert all(c.parameters.cp_comm_type == "all_gather" for c in plan.candidates)
    # at 128K tokens only cp layouts fit: cp 1 keeps a whole sequence's activations per rank
    assert plan.best is not None and plan.best.degrees.context_parallel_degree > 1
    assert not any(c.fits for c in plan.candidates if c.degrees.context_parallel_degree == 1)
    rows = longest_by_context_degree(plan)
    assert [e.degrees.context_parallel_degree for e, _ in rows] == [1, 2, 4, 8]
    for estimate, tokens in rows:
        assert tokens == longest_sequence(model, estimate.parameters, plan.cluster,
                                          plan.training)


def test_cli_shows_cp_layouts_and_their_longest_sequence(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", "140")
    with contextlib.redirect_stdout(out):
        status = plan_main(["--hidden-size", "4096", "--num-layers", "32", "--num-heads", "32",
                            "--num-kv-heads", "8", "--intermediate-size", "14336",
                            "--vocab-size", "128256", "--gpus", "8", "--seq-len", "131072",
                            "--cp-comm-type", "a2a", "--top", "3"])
    text = out.getvalue()
    assert status == 0
    assert "cp 8 (a2a):" in text and "| cp " in text
    assert "Longest sequence that fits" in text
    assert '"cp_comm_type": "a2a"' not in text  # the table, not JSON
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()):
        plan_main(["--num-params", "7e9", "--gpus", "8", "--cp-comm-type", "ring"])
    assert exit_info.value.code == 2


def test_preflight_refusal_suggests_a_cp_layout_of_the_jobs_comm_type():
    model = ModelSpec(name="mid", hidden_size=4096, num_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14_336, vocab_size=128_256)
    with pytest.raises(ConfigError) as refused:
        preflight({"torch_distributed": {"enabled": True},
                   "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                       "context_parallel_degree": 2, "cp_comm_type": "a2a"}}}},
                  model=model, instance_type="ml.p4d.24xlarge", seq_len=131_072)
    message = str(refused.value)
    assert "does not fit" in message and "cp 8" in message  # 128K tokens need cp 8 here
    assert '"context_parallel_degree": 8' in message and '"cp_comm_type": "a2a"' in message
