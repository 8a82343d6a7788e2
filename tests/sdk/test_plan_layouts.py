"""Candidate layouts, ranking, and the Estimator pre-flight."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshtrain import ConfigError
from meshtrain.contract import DistributionConfig, resolve_degrees
from meshtrain.plan import PRESETS, Training, build_cluster, plan_layouts, preflight
from meshtrain.plan.cluster import GIB
from meshtrain.plan.layouts import smallest_fitting_count
from meshtrain.plan.models import llama_shaped


def smp(**parameters):
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(1, 4), per_node=st.sampled_from([1, 2, 4, 8]),
       name=st.sampled_from(["llama2-7b", "mixtral-8x7b", "gpt-neox-20b", "llama3-8b"]))
def test_every_candidate_is_a_layout_the_runtime_accepts(nodes, per_node, name):
    cluster = build_cluster(gpus=nodes * per_node, gpus_per_node=per_node)
    plan = plan_layouts(PRESETS[name], cluster, Training())
    assert plan.candidates
    for estimate in plan.candidates:
        again = resolve_degrees(estimate.parameters, cluster.world_size,
                                ranks_per_host=per_node)
        assert again == estimate.degrees
        assert estimate.degrees.tensor_parallel_degree <= per_node  # TP inside a host
        degrees = estimate.degrees  # EP folded over shard x tp (issue 32)
        assert (degrees.hybrid_shard_degree * degrees.tensor_parallel_degree
                % degrees.expert_parallel_degree == 0)


def test_ranking_puts_fitting_layouts_first_fastest_first():
    plan = plan_layouts(PRESETS["llama2-13b"], build_cluster(gpus=16, gpu_memory_gib=40),
                        Training())
    fits = [e.fits for e in plan.candidates]
    assert True in fits and False in fits
    first_miss = fits.index(False)
    assert all(fits[:first_miss]) and not any(fits[first_miss:])
    speeds = [e.time.tokens_per_s for e in plan.candidates[:first_miss]]
    assert speeds == sorted(speeds, reverse=True)
    peaks = [e.memory.peak_bytes for e in plan.candidates[first_miss:]]
    assert peaks == sorted(peaks)  # the closest miss first
    assert plan.best is plan.candidates[0]


def test_7b_on_eight_80gib_gpus_recommends_a_fitting_layout():
    plan = plan_layouts(llama_shaped(7e9), build_cluster(gpus=8), Training())
    assert plan.best is not None and plan.best.fits
    assert plan.best.memory.peak_bytes <= plan.cluster.capacity_bytes
    assert plan.model_state_bytes_per_gpu["zero3"] == 7e9 * 16 / 8


def test_cpu_cluster_cannot_judge_fit():
    plan = plan_layouts(PRESETS["llama2-7b"], build_cluster(instance_type="ml.m5.xlarge",
                                                            instance_count=2), Training())
    assert plan.best is not None and plan.best.fits is None


def test_smallest_fitting_count_is_minimal():
    model, training = PRESETS["llama2-70b"], Training()

    def build(count):
        return build_cluster(instance_type="ml.p4d.24xlarge", instance_count=count)

    count, plan = smallest_fitting_count(model, training, build, above=1)
    assert plan.best.fits and plan.cluster.num_nodes == count
    assert plan_layouts(model, build(count - 1), training).best is None


def test_preflight_refuses_70b_without_sharding_on_one_p4d():
    with pytest.raises(ConfigError) as error:
        preflight(smp(hybrid_shard_degree=1), model="llama2-70b",
                  instance_type="ml.p4d.24xlarge", instance_count=1)
    message = str(error.value)
    assert "does not fit on 1 x ml.p4d.24xlarge" in message
    assert "hybrid_shard_degree=1" in message
    assert "parameters 128.5 GiB" in message  # 2 B x 69.0e9 / 2^30, nothing sharded
    # It names a layout that fits: following the advice passes the pre-flight.
    count = int(re.search(r"instance_count=(\d+)", message).group(1))
    suggested = json.loads(re.search(r"distribution=(\{.*\})", message).group(1))
    accepted = preflight(suggested, model="llama2-70b", instance_type="ml.p4d.24xlarge",
                         instance_count=count)
    assert accepted.candidates[0].fits


def test_preflight_accepts_a_fitting_70b_layout():
    plan = preflight(smp(hybrid_shard_degree=32, activation_checkpointing=True),
                     model="llama2-70b", instance_type="ml.p5.48xlarge", instance_count=4)
    estimate = plan.candidates[0]
    assert estimate.fits and estimate.degrees.hybrid_shard_degree == 32
    assert estimate.memory.states.total == pytest.approx(16 * 68_976_648_192 / 32, rel=1e-3)
    assert estimate.memory.peak_bytes < 81559 / 1024 * GIB


def test_preflight_suggests_a_layout_on_the_same_cluster_when_one_fits():
    with pytest.raises(ConfigError, match="A layout that fits on this cluster") as error:
        preflight(smp(hybrid_shard_degree=1), model="llama2-7b",
                  instance_type="ml.p4de.24xlarge", instance_count=1)
    suggested = json.loads(re.search(r"distribution=(\{.*\})", str(error.value)).group(1))
    assert preflight(suggested, model="llama2-7b", instance_type="ml.p4de.24xlarge").best.fits


def test_preflight_inputs():
    config = DistributionConfig.from_dict(smp(hybrid_shard_degree=8, mixed_precision="fp32"))
    plan = preflight(config, model=PRESETS["llama2-7b"], instance_type="ml.p4de.24xlarge",
                     seq_len=1024)
    assert plan.candidates[0].degrees.world_size == 8
    assert plan.training.precision == "fp32"  # the distribution's mixed_precision wins
    assert plan.candidates[0].activations.layer_terms["projection_inputs"] == 2 * 4 * 1024 * 4096
    with pytest.raises(ConfigError, match="tensor_parallel_degree=3 does not divide"):
        preflight(smp(tensor_parallel_degree=3), model="llama2-7b",
                  instance_type="ml.p4d.24xlarge")
    per_host = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}
    cpu = preflight(per_host, model="llama2-70b", instance_type="ml.m5.xlarge", instance_count=2)
    assert cpu.candidates[0].fits is None and cpu.cluster.world_size == 4
