"""SMP v2 compat on 4 real gloo ranks, one shared launch (workers/smp_style.py).

Covers: an SMP-style script (tsm.init, HF Llama, tsm.transform, FSDP1 + transformer auto-wrap,
apply_activation_checkpointing) matching a one-process run with hybrid 2 and with tp 2;
SMP's sharded (per tp rank) and local async checkpoints resuming, also on another layout; FSDP1
with experts split over ep=2 (a Mixtral) matching one process and resuming; every
tsm.state field on every rank of 2x2 layouts; estimator parameters winning over tsm.init's dict.
"""

from __future__ import annotations

from pathlib import Path

import pytest

WORKER = Path(__file__).parent / "workers" / "smp_style.py"
TOLERANCE = 1e-5

pytestmark = pytest.mark.multiprocess  # a 4-rank torchrun: not in the fast tier


@pytest.fixture(scope="module")
def records(torchrun):
    return torchrun(WORKER, 4, timeout=400)


def cases(records, name):
    found = [r for r in records if r["case"] == name]
    assert len(found) == 4, f"{name}: expected a record from each of 4 ranks, got {len(found)}"
    return found


def reference(records):
    return cases(records, "reference")[0]["losses"]


@pytest.mark.parametrize("layout", ["hybrid2", "tp2"])
def test_training_matches_one_process(records, layout):
    expected = reference(records)
    for record in cases(records, layout):
        assert len(record["losses"]) == len(expected) == 4
        assert record["losses"] == pytest.approx(expected, abs=TOLERANCE)


@pytest.mark.parametrize("layout", ["hybrid2", "tp2"])
def test_clip_grad_norm_matches_one_process(records, layout):
    """tsm.grad_norm.clip_grad_norm_ returns the one-process total norm (FSDP1 + TP: tp-split
    gradients summed over tp, norm weights counted once); every step is clipped."""
    expected = cases(records, "reference")[0]["norms"]
    assert len(expected) == 4 and min(expected) > 1.0  # above MAX_NORM = 0.5
    for record in cases(records, layout):
        assert record["norms"] == pytest.approx(expected, abs=TOLERANCE)


def test_fsdp2_fully_shard_without_mesh_uses_smp_group(records):
    expected = reference(records)
    for record in cases(records, "fsdp2_hybrid2"):
        assert record["mesh_shape"] == [2, 2]  # (replicate, shard): HSDP over SMP's layout
        assert record["losses"] == pytest.approx(expected, abs=TOLERANCE)


@pytest.mark.parametrize("case", [
    "resume_sharded_hybrid_to_full4",  # another layout: 2 replicas x 2 shards -> 4 shards
    "resume_local_hybrid",             # SM_LOCAL async save, same shard degree
    "resume_sharded_tp2",              # one checkpoint folder per tp rank
    "resume_local_tp2",
])
def test_smp_checkpoints_resume(records, case):
    # saved after 2 of 4 steps: the resumed job runs steps 3 and 4 and matches the reference
    # (the second resumed step also depends on the optimizer state the checkpoint restored)
    expected = reference(records)[2:]
    assert len(expected) == 2
    for record in cases(records, case):
        assert record["losses"] == pytest.approx(expected, abs=TOLERANCE)


def test_fsdp1_with_expert_parallelism_matches_one_process(records):
    """AWS's MoE path: tsm.transform splits a Mixtral's 4 experts over ep=2, the script's FSDP1
    shards over the ranks holding the same experts; losses and clipped norms match one process
    (dense gradients averaged over all 4 ranks, experts' over their EP group's tokens), and
    SMP's sharded checkpoint (one folder per ep rank) resumes to the same losses."""
    expected = cases(records, "moe_reference")[0]
    assert len(expected["losses"]) == 4 and min(expected["norms"]) > 1.0  # every step clipped
    for record in cases(records, "fsdp1_ep2"):
        assert record["losses"] == pytest.approx(expected["losses"], abs=TOLERANCE)
        assert record["norms"] == pytest.approx(expected["norms"], abs=TOLERANCE)
    for record in cases(records, "resume_sharded_ep2"):
        assert record["losses"] == pytest.approx(expected["losses"][2:], abs=TOLERANCE)


def test_state_fields_tp2_hybrid2(records):
    for r in cases(records, "state_tp2_hybrid2"):
        rank = r["rank"]
        assert (r["rank"], r["world_size"], r["is_initialized"]) == (rank, 4, True)
        assert r["hybrid_shard_degree"] == 2
        assert r["tensor_parallel_degree"] == r["tp_size"] == 2
        assert r["tp_rank"] == rank % 2
        assert r["tp_process_group"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert (r["expert_parallel_degree"], r["ep_size"], r["ep_rank"]) == (1, 1, 0)
        assert (r["context_parallel_degree"], r["cp_size"], r["cp_rank"]) == (1, 1, 0)
        assert r["cp_process_group"] == [rank]
        assert (r["dp_rank"], r["dp_size"]) == (rank // 2, 2)
        assert r["world_process_group"] == [0, 1, 2, 3]
        assert r["rep_rank"] == 0 and r["rep_groups"] == [[0], [1], [2], [3]]
        assert r["rep_rank_process_group"] == [0, 1, 2, 3]
        assert r["sm_activation_offloading"] is False
        assert (r["activation_loading_horizon"], r["random_seed"]) == (2, 7)
    draws = {r["rank"]: r["tracker_draw"] for r in cases(records, "state_tp2_hybrid2")}
    # the RNG tracker streams are seeded random_seed + tp_rank: tp ranks differ, dp ranks agree
    assert draws[0] == draws[2] != draws[1] == draws[3]


def test_state_fields_hybrid2_two_replicas(records):
    for r in cases(records, "state_hybrid2_x2"):
        rank = r["rank"]
        assert r["hybrid_shard_degree"] == 2 and r["tp_size"] == 1 and r["tp_rank"] == 0
        assert r["tp_process_group"] == [rank]
        assert (r["dp_rank"], r["dp_size"]) == (rank, 4)
        assert r["rep_rank"] == rank // 2
        assert r["rep_groups"] == [[0, 2], [1, 3]]
        assert r["rep_rank_process_group"] == ([0, 1] if rank < 2 else [2, 3])
        assert r["sm_activation_offloading"] is True and r["random_seed"] is None


def test_estimator_parameters_win_over_init_dict(records):
    for r in cases(records, "estimator_wins"):
        assert r["hybrid_shard_degree"] == 2  # from SM_HP_MP_PARAMETERS, not init's 4
        assert r["activation_loading_horizon"] == 3  # keys the estimator did not send stay


def test_smp_checkpoint_and_meshtrain_checkpoint_load_each_other(records):
    """meshtrain's load_checkpoint resumes the SMP-API checkpoint (FSDP2, 4 shards), and its own
    save_checkpoint is resumed through the SMP API (FSDP1, hybrid 2): both match step 3."""
    expected = reference(records)[2:3]
    for record in cases(records, "interop"):
        assert record["meshtrain_from_shim"] == pytest.approx(expected, abs=TOLERANCE)
        assert record["shim_from_meshtrain"] == pytest.approx(expected, abs=TOLERANCE)


@pytest.mark.parametrize("case", ["state_tp2_hybrid2", "state_hybrid2_x2"])
def test_smp_meshes_use_the_world_mesh_groups(records, case):
    """FSDP1's (shard, tp) and (replicate, shard) meshes and FSDP2's are built over the process
    groups of the runtime's one world mesh: SMP's flow creates no group of its own."""
    for r in cases(records, case):
        assert r["compat_groups_outside_world_mesh"] == []
