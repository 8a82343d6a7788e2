"""The planner's pipeline-parallel layouts: in-flight microbatches, bubble, p2p, per-stage
memory, ranking and the Estimator's pre-flight (hand-computed figures on a tiny Llama)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.contract.distribution import SMPParameters
from meshtrain.plan import ModelSpec, Training, activation_bytes, build_cluster, preflight
from meshtrain.plan.cli import plan_main
from meshtrain.plan.layouts import estimate_layout, plan_layouts, reasoning
from meshtrain.plan.pipeline import bubble_fraction, in_flight
from meshtrain.plan.schema import PLAN_JSON_SCHEMA

# 8 blocks of 4 x 64 x 64 (attention) + 3 x 64 x 128 (SwiGLU) + 2 x 64 (norms) = 41,088
# parameters; embedding and head 256 x 64 = 16,384 each; final norm 64.
TINY = ModelSpec(name="tiny", family="llama", hidden_size=64, num_layers=8,
                 num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                 vocab_size=256)
BLOCK, END, NORM = 41_088, 16_384, 64
CLUSTER = build_cluster(gpus=4, gpu_memory_gib=80)


def test_tiny_model_parameter_count_is_the_hand_count():
    assert TINY.num_params == 8 * BLOCK + 2 * END + NORM


@pytest.mark.parametrize(("schedule", "pp", "m", "v", "first", "last"), [
    ("GPipe", 2, 4, 1, 4, 4),            # every forward before any backward
    ("GPipe", 4, 8, 1, 8, 8),
    ("1F1B", 2, 4, 1, 2, 1),             # min(m, p - rank)
    ("1F1B", 4, 8, 1, 4, 1),
    ("1F1B", 4, 2, 1, 2, 1),             # capped by m
    ("Interleaved1F1B", 2, 4, 2, 5, 3),  # (v-1) x m/rounds + 2 (p-1-r) warm-up, + 1
    ("Interleaved1F1B", 4, 8, 2, 11, 5),
    ("ZBVZeroBubble", 2, 4, 2, 4, 4),    # 2p on every rank of the V
    ("ZBVZeroBubble", 4, 8, 2, 8, 8),
])
def test_in_flight_chunk_microbatches(schedule, pp, m, v, first, last):
    assert in_flight(schedule, pp, m, v, 0) == first
    assert in_flight(schedule, pp, m, v, pp - 1) == last


def _torch_peak(actions: list) -> int:
    from torch.distributed.pipelining.schedules import _ComputationType as T

    live = peak = 0
    for action in actions:
        if action is None:
            continue
        live += {T.FORWARD: 1, T.FULL_BACKWARD: -1, T.BACKWARD_INPUT: -1}.get(
            action.computation_type, 0)
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (2, 8), (4, 12)])
def test_in_flight_matches_torchs_own_schedule_order(pp, m):
    """torch's per-rank action lists (the order its runtime executes): forwards not yet
    followed by their (input-)backward, at their most, are what the planner counts."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for rank in range(pp):
        inter = object.__new__(schedules.ScheduleInterleaved1F1B)
        inter.pp_group_size, inter._n_microbatches, inter.n_local_stages = pp, m, 2
        inter.number_of_rounds = max(1, m // pp)
        inter.microbatches_per_round = m // inter.number_of_rounds
        assert _torch_peak(inter._calculate_single_rank_operations(rank)) == in_flight(
            "Interleaved1F1B", pp, m, 2, rank)
        zbv = object.__new__(schedules.ScheduleZBVZeroBubble)
        zbv.pp_group_size, zbv._n_microbatches, zbv.num_stages = pp, m, 2 * pp
        assert _torch_peak(zbv._calculate_single_rank_operations(rank)) == in_flight(
            "ZBVZeroBubble", pp, m, 2, rank)


@pytest.mark.parametrize(("schedule", "pp", "m", "v", "expected"), [
    ("GPipe", 2, 4, 1, 1 / 5), ("1F1B", 2, 4, 1, 1 / 5), ("1F1B", 4, 8, 1, 3 / 11),
    ("Interleaved1F1B", 2, 4, 2, 1 / 9), ("Interleaved1F1B", 4, 8, 2, 3 / 19),
    ("ZBVZeroBubble", 2, 4, 2, 1 / 25), ("ZBVZeroBubble", 4, 8, 2, 3 / 51),
    ("1F1B", 1, 4, 1, 0.0),
])
def test_bubble_fraction(schedule, pp, m, v, expected):
    assert bubble_fraction(schedule, pp, m, v) == pytest.approx(expected)


def _estimate(pp: int, schedule: str = "1F1B", m: int = 4, **extra):
    params = SMPParameters(pipeline_parallel_degree=pp, pipeline_schedule=schedule,
                           microbatches=m, hybrid_shard_degree=1, **extra)
    training = Training(seq_len=32, micro_batch=8, fused_optimizer=True)
    return estimate_layout(TINY, params, CLUSTER, training)


def test_p2p_bytes_and_step_time_include_the_bubble():
    estimate = _estimate(2)
    terms = estimate.pipeline
    # 2 directions x 4 microbatches x 2 rows x 32 tokens x 64 hidden x 2 bytes (bf16)
    assert terms.p2p_bytes_per_boundary == 2 * 4 * 2 * 32 * 64 * 2 == 65_536
    assert estimate.comm.pipeline_p2p == 65_536
    time = estimate.time
    assert time.bubble_fraction == pytest.approx(1 / 5)
    assert time.step_s == pytest.approx(time.busy_s / (1 - 1 / 5))
    # dp = 4 ranks / pp 2 = 2 ranks of 8 rows x 32 tokens
    assert time.tokens_per_step == 2 * 8 * 32
    interleaved = _estimate(2, "Interleaved1F1B")
    assert interleaved.comm.pipeline_p2p == 2 * 65_536  # two stages per rank: two boundaries


@pytest.mark.parametrize(("pp", "schedule", "m", "k_first", "k_last", "blocks"), [
    (2, "1F1B", 4, 2, 1, 4), (4, "1F1B", 4, 4, 1, 2), (2, "GPipe", 4, 4, 4, 4),
    (4, "GPipe", 8, 8, 8, 2), (2, "Interleaved1F1B", 4, 5, 3, 2), (4, "ZBVZeroBubble", 4, 8, 8, 1),
])
def test_peak_rank_holds_its_blocks_in_flight_activations(pp, schedule, m, k_first, k_last,
                                                          blocks):
    estimate = _estimate(pp, schedule, m)
    terms = estimate.pipeline
    rows = 8 // m
    one = activation_bytes(TINY, seq_len=32, micro_batch=rows)
    assert (terms.in_flight_first, terms.in_flight_last, terms.blocks_per_stage) == (
        k_first, k_last, blocks)
    k = k_first if terms.peak_stage == "first" else k_last
    acts = estimate.activations
    assert acts.num_layers - acts.num_checkpointed == k * blocks
    assert acts.layer_bytes == one.layer_bytes  # each microbatch: micro_batch / m rows
    block_part = acts.total_bytes - sum(acts.model_terms.values())
    assert block_part == k * blocks * one.layer_bytes


def test_peak_stage_states_are_its_blocks_and_its_end():
    """pp2, no sharding: 4 blocks + the embedding (first) or the head (last), the final norm
    with the stage's root; 16 bytes per parameter (bf16 + bf16 + fp32 master and moments)."""
    first_or_last = 4 * BLOCK + END + NORM
    assert _estimate(2).memory.states.total == 16 * first_or_last
    # pp4: 2 blocks per stage
    assert _estimate(4).memory.states.total == 16 * (2 * BLOCK + END + NORM)
    # ZBV: rank 0 holds stage 0 and stage 2p - 1 (the V): both ends, 2 x 1 block at pp4
    assert _estimate(4, "ZBVZeroBubble").memory.states.total == 16 * (2 * BLOCK + 2 * END + NORM)
    # sharded over the stage's 2 ranks (4 ranks / pp 2): half of each (all shapes even)
    sharded = estimate_layout(TINY, SMPParameters(
        pipeline_parallel_degree=2, microbatches=4, hybrid_shard_degree=2), CLUSTER,
        Training(seq_len=32, micro_batch=8))
    assert sharded.memory.states.total == 16 * first_or_last // 2


def test_one_f_one_b_holds_fewer_activations_than_gpipe():
    gpipe, one_f_one_b = _estimate(4, "GPipe", 8), _estimate(4, "1F1B", 8)
    assert one_f_one_b.activations.total_bytes < gpipe.activations.total_bytes
    assert one_f_one_b.memory.peak_bytes < gpipe.memory.peak_bytes


def test_rows_must_split_into_the_microbatches():
    params = SMPParameters(pipeline_parallel_degree=2, microbatches=4)
    with pytest.raises(ConfigError, match=r"micro_batch=6 .* microbatches=4"):
        estimate_layout(TINY, params, CLUSTER, Training(seq_len=32, micro_batch=6))


# A model with 3 attention heads (no TP degree > 1 divides them) whose 4 rows of a long
# sequence keep too many activations on any one rank unless a pipeline splits the blocks and
# runs them one row at a time.
WIDE = ModelSpec(name="wide", family="llama", hidden_size=192, num_layers=8,
                 num_attention_heads=3, num_key_value_heads=3, intermediate_size=512,
                 vocab_size=32000)
WIDE_TRAINING = Training(seq_len=4096, micro_batch=4)


def _wide_plan(gpu_gib: float):
    cluster = build_cluster(gpus=2, gpu_memory_gib=gpu_gib, reserve_gib=0)
    return plan_layouts(WIDE, cluster, WIDE_TRAINING)


def test_pipeline_layouts_are_ranked_with_the_others_and_win_where_only_they_fit():
    plan = _wide_plan(1000)
    pipelined = [c for c in plan.candidates if c.pipeline is not None]
    others = [c for c in plan.candidates if c.pipeline is None]
    assert pipelined and others
    assert all(c.degrees.tensor_parallel_degree == 1 for c in plan.candidates)
    smallest_pp = min(c.memory.peak_bytes for c in pipelined)
    smallest_other = min(c.memory.peak_bytes for c in others)
    assert smallest_pp < smallest_other  # the loss's fp32 logits of 1 row instead of 4
    capacity_gib = (smallest_pp + smallest_other) / 2 / 2**30
    tight = _wide_plan(capacity_gib)
    assert tight.best is not None and tight.best.fits
    assert tight.best.pipeline is not None and tight.best.degrees.pipeline_parallel_degree == 2
    assert not any(c.fits for c in tight.candidates if c.pipeline is None)
    # with room for everything, the pipeline's bubble ranks it below a layout without one
    assert plan.best.pipeline is None
    assert "1F1B bubble idles 20% of the step" in reasoning(tight.best, tight)  # (2-1)/(4+2-1)


def test_cli_shows_pp_and_takes_microbatches_and_schedule(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "140")
    argv = ["--hidden-size", "192", "--num-layers", "8", "--num-heads", "3",
            "--intermediate-size", "512", "--gpus", "2", "--seq-len", "4096",
            "--micro-batch", "4", "--microbatches", "2", "--pipeline-schedule", "GPipe",
            "--top", "0"]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "pp 2 (GPipe, 2 mb, bubble 33%)" in out
    assert "Pipeline layouts: GPipe over 2 microbatches of 2 row(s)" in out
    assert plan_main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    jsonschema.validate(data, PLAN_JSON_SCHEMA)
    assert data["training"]["microbatches"] == 2
    pipelined = [c for c in data["candidates"] if c["pipeline"] is not None]
    assert pipelined and all(c["degrees"]["pipeline_parallel_degree"] == 2 for c in pipelined)
    terms = pipelined[0]["pipeline"]
    assert (terms["schedule"], terms["in_flight_first"], terms["rows_per_microbatch"]) == (
        "GPipe", 2, 2)
    assert terms["bubble_fraction"] == pytest.approx(1 / 3)
    layout = pipelined[0]["distribution"]["smdistributed"]["modelparallel"]["parameters"]
    assert (layout["pipeline_parallel_degree"], layout["microbatches"],
            layout["pipeline_schedule"]) == (2, 2, "GPipe")
    assert plan_main([*argv[:-4], "--microbatches", "0"]) == 2


def test_preflight_accepts_a_fitting_pipeline_layout():
    pipelined = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"pipeline_parallel_degree": 2, "microbatches": 4,
                                        "hybrid_shard_degree": 4}}}}
    plan = preflight(pipelined, model="llama2-7b", instance_type="ml.p4d.24xlarge",
                     seq_len=2048, micro_batch=4)
    assert plan.candidates[0].pipeline.degree == 2 and plan.candidates[0].fits


def test_estimator_refuses_a_pipeline_layout_that_cannot_fit_before_any_job(tmp_path,
                                                                            monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MESHTRAIN_HOME", str(home))
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('train')\n")
    # llama2-70b over 8 stages of one unsharded rank each: 10 blocks x 16 bytes per parameter
    # per rank is ~135 GiB, more than an A100's 40 GiB.
    pipelined = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"pipeline_parallel_degree": 8, "microbatches": 8,
                                        "hybrid_shard_degree": 1}}}}
    estimator = Estimator("train.py", source_dir=str(source), instance_type="ml.p4d.24xlarge",
                          role="arn:aws:iam::123456789012:role/Trainer", distribution=pipelined,
                          plan_model="llama2-70b", plan_options={"micro_batch": 8})
    with pytest.raises(ConfigError) as info:
        estimator.fit(wait=False)
    message = str(info.value)
    assert "pipeline_parallel_degree=8" in message and "pipeline: the" in message
    assert "rank peaks, holding 10 block(s) per stage" in message
    assert estimator._backend is None
    assert not (home / "jobs").exists()
