"""init() and state in a single plain process (world size 1), config sources and error paths.

Multi-rank coordinates, meshes and groups are asserted in test_hsdp_layouts.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import meshtrain_runtime
from meshtrain.contract import SMPParameters
from meshtrain.errors import ConfigError


def test_import_does_not_load_torch() -> None:
    code = (
        "import sys, meshtrain_runtime as m; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert set(m.__all__) <= set(dir(m)); print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_state_before_init_raises(single_process_runtime) -> None:
    assert not meshtrain_runtime.is_initialized()
    with pytest.raises(RuntimeError, match=r"call meshtrain_runtime\.init\(\)"):
        _ = meshtrain_runtime.state.rank


def test_unknown_state_attribute(single_process_runtime) -> None:
    with pytest.raises(AttributeError, match="no_such_field"):
        _ = meshtrain_runtime.state.no_such_field


def test_single_plain_process_is_a_world_of_one(single_process_runtime) -> None:
    st = meshtrain_runtime.init()
    state = meshtrain_runtime.state
    assert meshtrain_runtime.is_initialized()
    assert (state.rank, state.world_size, state.local_rank) == (0, 1, 0)
    assert state.mesh.mesh_dim_names == ("replicate", "shard", "tp")
    assert tuple(state.mesh.shape) == (1, 1, 1)
    assert state.mesh is state.meshes.dense  # views of the one world mesh (meshtrain_runtime.mesh)
    assert state.world_mesh.mesh_dim_names == ("world",) and state.world_mesh.size() == 1
    assert state.dp_mesh.mesh_dim_names == ("dp",) and state.dp_mesh.size() == 1
    assert state.sharding_strategy == "no_shard"  # one rank: nothing to shard
    assert (state.hybrid_shard_degree, state.replicate_degree) == (1, 1)
    assert (state.tp_size, state.tp_rank, state.ep_size, state.ep_rank) == (1, 0, 1, 0)
    assert (state.dp_rank, state.dp_size, state.cp_rank, state.cp_size) == (0, 1, 0, 1)
    assert state.tensor_parallel_degree == state.tp_size
    assert state.expert_parallel_degree == state.ep_size
    assert state.expert_mesh is None and state.ep_process_group is None
    assert state.tp_process_group.size() == 1
    assert state.world_process_group.size() == 1
    assert state.rep_rank_process_group.size() == 1
    assert state.device.type == "cpu"
    assert state.config == SMPParameters() and state.random_seed is None
    assert st is state.current()


def test_package_state_survives_submodule_import(single_process_runtime) -> None:
    import meshtrain_runtime.state  # rebinds the package attribute to the module: still works

    meshtrain_runtime.init({"random_seed": 3})
    from meshtrain_runtime import state

    assert state.random_seed == 3 and meshtrain_runtime.state.random_seed == 3


def test_config_from_dict_json_file_and_parameters(single_process_runtime, tmp_path) -> None:
    assert meshtrain_runtime.init({"random_seed": 11}).random_seed == 11
    meshtrain_runtime.reset()
    path = tmp_path / "smp.json"
    path.write_text(json.dumps({"random_seed": 12, "mixed_precision": "bf16"}))
    assert meshtrain_runtime.init(str(path)).config.mixed_precision == "bf16"
    meshtrain_runtime.reset()
    assert meshtrain_runtime.init(path).random_seed == 12
    meshtrain_runtime.reset()
    assert meshtrain_runtime.init(SMPParameters(random_seed=13)).random_seed == 13


@pytest.mark.parametrize("encoded", [False, True], ids=["json", "json-of-json"])
def test_estimator_parameters_take_priority(single_process_runtime, monkeypatch, encoded) -> None:
    value = json.dumps({"random_seed": 2})
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps(value) if encoded else value)
    st = meshtrain_runtime.init({"random_seed": 1, "mixed_precision": "bf16"})
    assert st.random_seed == 2  # SMP v2: estimator-provided parameters win, key by key
    assert st.config.mixed_precision == "bf16"  # keys the estimator did not set are kept


def test_init_twice(single_process_runtime) -> None:
    first = meshtrain_runtime.init({"random_seed": 1})
    assert meshtrain_runtime.init({"random_seed": 1}) is first
    with pytest.raises(ConfigError, match=r"reset\(\)"):
        meshtrain_runtime.init({"random_seed": 2})
    meshtrain_runtime.reset()
    assert not meshtrain_runtime.is_initialized()
    assert meshtrain_runtime.init({"random_seed": 2}).random_seed == 2


def test_reset_keeps_the_process_group_unless_asked(single_process_runtime) -> None:
    import torch.distributed as dist

    meshtrain_runtime.init()
    meshtrain_runtime.reset()
    assert dist.is_initialized()
    meshtrain_runtime.init()
    meshtrain_runtime.reset(destroy_process_group=True)
    assert not dist.is_initialized()


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"hybrid_shard_degree": 2}, "hybrid_shard_degree=2 does not divide the data-parallel "
         "size 1 (world size 1 (1 host x 1 process)). Use 1, or 0"),
        ({"tensor_parallel_degree": 2}, "tensor_parallel_degree=2 does not divide world size 1"),
        ({"expert_parallel_degree": 2}, "expert_parallel_degree=2 must divide the resolved"),
        ({"context_parallel_degree": 2}, "context_parallel_degree=2 must divide the resolved"),
        ({"hybrid_shard_degre": 2}, "hybrid_shard_degree"),
        ({"sharding_strategy": "no_shard", "hybrid_shard_degree": 2}, "contradicts"),
        ({"sharding_strategy": "full_shard", "hybrid_shard_degree": 1}, "contradicts"),
        ({"mixed_precision": "int8"}, "mixed_precision"),
        (42, "takes a dict of SMP parameters or a path"),
        ("/no/such/smp.json", "is not an existing file"),
    ],
)
def test_bad_config_is_a_config_error(single_process_runtime, config, fragment) -> None:
    with pytest.raises(ConfigError) as caught:
        meshtrain_runtime.init(config)
    assert fragment in str(caught.value)
    assert not meshtrain_runtime.is_initialized()


def test_bad_json_file_and_environment(single_process_runtime, tmp_path, monkeypatch) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot parse"):
        meshtrain_runtime.init(path)
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        meshtrain_runtime.init(path)
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", "{oops")
    with pytest.raises(ConfigError, match="SM_HP_MP_PARAMETERS is not valid JSON"):
        meshtrain_runtime.init()
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", "[3]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        meshtrain_runtime.init()


def test_the_process_group_init_started_is_torn_down_at_interpreter_exit() -> None:
    # Outside meshtrain's rank entry nothing else ends it, and gloo's threads can then abort a
    # finished rank during C++ teardown. atexit runs last-registered first, so the probe
    # registered before init() sees the state after the runtime's teardown.
    probe = """
import atexit
import torch.distributed as dist
import meshtrain_runtime
atexit.register(lambda: print("initialized at exit:", dist.is_initialized(), flush=True))
meshtrain_runtime.init()
print("initialized:", dist.is_initialized(), flush=True)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.splitlines() == ["initialized: True", "initialized at exit: False"]


# (pp, replicate, shard, tp, cp) on 4 ranks: degrees [pipeline] / [context] will resolve
GLOO_DEGREES = [(2, 1, 2, 1, 1), (1, 2, 2, 1, 2), (2, 1, 2, 1, 2), (2, 1, 1, 2, 1)]


@pytest.mark.multiprocess
def test_pipeline_and_context_axes_on_gloo_ranks(torchrun) -> None:
    """state.pp_rank / cp_rank / dp_rank and their groups on 4 gloo ranks, from hand-made
    degrees: pp outermost, cp innermost in the sharding group, dp_rank = dp // cp with
    dp_size = world / (pp x tp x cp); each group's all-reduce sums exactly its ranks."""
    cases = [{"world_size": 4, "pipeline_parallel_degree": pp, "replicate_degree": rep,
              "hybrid_shard_degree": shard, "tensor_parallel_degree": tp,
              "context_parallel_degree": cp, "expert_parallel_degree": 1,
              "sharding_strategy": "full_shard"} for pp, rep, shard, tp, cp in GLOO_DEGREES]
    records = torchrun(Path(__file__).parent / "workers" / "mesh_degrees.py", 4,
                       json.dumps(cases), timeout=300)
    assert len(records) == 4 * len(cases)
    for row in records:
        d, rank = row["degrees"], row["rank"]
        pp, rep, shard = (d[k] for k in ("pipeline_parallel_degree", "replicate_degree",
                                          "hybrid_shard_degree"))
        tp, cp = d["tensor_parallel_degree"], d["context_parallel_degree"]
        stage = rep * shard * tp
        p, t = rank // stage, rank % tp
        r, s = divmod((rank % stage) // tp, shard)
        assert (row["pp_rank"], row["pp_size"], row["pipeline_parallel_degree"]) == (p, pp, pp)
        assert (row["replicate_rank"], row["shard_rank"], row["tp_rank"]) == (r, s, t)
        assert (row["cp_rank"], row["cp_size"]) == (s % cp, cp)
        assert row["dp_size"] == 4 // (pp * tp * cp)
        assert row["dp_rank"] == (r * shard + s) // cp
        if pp == 1:  # AWS's SMP scripts: dp_rank = rank // (tp x cp)
            assert row["dp_rank"] == rank // (tp * cp)
        pp_group = [q * stage + rank % stage for q in range(pp)]
        cp_group = [rank - (s % cp) * tp + c * tp for c in range(cp)]
        dp_group = [p * stage + i * tp + t for i in range(rep * shard)]
        assert row["pp_group"] == pp_group and row["cp_group"] == cp_group
        assert row["dp_group"] == dp_group
        assert row["tp_group"] == [rank - t + k for k in range(tp)]
        assert row["sums"] == [sum(pp_group), sum(cp_group), sum(dp_group)]
        assert row["mesh"][0] == ["replicate", "shard", "tp"]  # this stage's dense view
        assert row["mesh"][1] == [[[p * stage + (i * shard + j) * tp + k for k in range(tp)]
                                   for j in range(shard)] for i in range(rep)]
