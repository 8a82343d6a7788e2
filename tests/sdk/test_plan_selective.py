"""The planner's op-level selective checkpointing (activation_checkpointing: "selective")."""

from __future__ import annotations

import pytest

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.plan import PRESETS, Training, build_cluster, estimate_layout
from meshtrain.plan.comm import communication_volumes
from meshtrain.plan.layouts import candidate_parameters
from meshtrain.plan.report import short_layout

CLUSTER = build_cluster(gpus=8, gpu_memory_gib=80)
TRAINING = Training(seq_len=4096, precision="bf16")
MODEL = PRESETS["llama3-8b"].model_copy(update={"num_layers": 8})


def _estimate(value: bool | str, **parameters):
    return estimate_layout(MODEL, SMPParameters(activation_checkpointing=value, **parameters),
                           CLUSTER, TRAINING)


def test_selective_sits_between_full_and_none_in_memory_and_costs_no_recompute_flops():
    none, full, selective = _estimate(False), _estimate(True), _estimate("selective")
    assert full.memory.peak_bytes < selective.memory.peak_bytes < none.memory.peak_bytes
    assert full.activations.total_bytes < selective.activations.total_bytes \
        < none.activations.total_bytes
    # the recompute runs the cheap ops only: no matmul FLOPs are added, full adds a forward
    assert selective.time.compute_s == pytest.approx(none.time.compute_s)
    assert full.time.compute_s > selective.time.compute_s
    assert short_layout(selective).endswith("| sac")
    assert short_layout(_estimate("selective", activation_offloading=True)).endswith(
        "| sac+offload")


def test_selective_keeps_the_sequence_parallel_reduce_scatter():
    """With sequence parallelism a recomputed layer repeats two all-gathers and the attention's
    reduce-scatter; a selective layer keeps the reduce-scatter's output."""
    degrees = resolve_degrees(SMPParameters(tensor_parallel_degree=2), 8)
    full, selective = (communication_volumes(MODEL, degrees, TRAINING, recompute=1.0,
                                             sequence_parallel=True, selective=flag)
                       for flag in (False, True))
    plain = communication_volumes(MODEL, degrees, TRAINING, sequence_parallel=True)
    repeated_full = full.tensor_parallel - plain.tensor_parallel
    repeated_selective = selective.tensor_parallel - plain.tensor_parallel
    assert repeated_selective == pytest.approx(repeated_full * 2 / 3)


def test_candidates_offer_selective_for_decoder_only_models():
    policies = {p.activation_checkpointing for p in candidate_parameters(
        MODEL, build_cluster(gpus=2, gpu_memory_gib=80))}
    assert policies == {False, True, "selective"}
    t5 = {p.activation_checkpointing for p in candidate_parameters(
        PRESETS["t5-3b"], build_cluster(gpus=2, gpu_memory_gib=80))}
    assert t5 == {False, True}
