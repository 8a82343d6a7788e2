"""meshtrain_runtime.mesh: one world mesh and its views, for several degree combinations.

One subprocess plays every rank of 8- and 4-rank worlds in turn on torch's fake process group
(no collectives run; DeviceMesh bookkeeping is real) and reports each rank's meshes; the
expected layout is computed here from the rank formula ``rank = (replicate * shard + s) * tp + t``
(and ``s = shard_mod_ep * ep + e`` with expert parallelism). Degrees the parameters cannot
express yet (pipeline stages, context parallelism with sharding) are built from hand-made
ResolvedDegrees: ``rank = ((p * replicate + r) * shard + s) * tp + t``,
``s = shard_mod_cp * cp + c``.
Real gloo groups are checked in test_hsdp_layouts.py::test_state_coordinates_and_groups and, for
pp / cp > 1, in test_state.py::test_pipeline_and_context_axes_on_gloo_ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshtrain.contract import ResolvedDegrees, SMPParameters, resolve_degrees
from meshtrain.contract.mesh_axes import (
    DENSE_AXES,
    EXPERT_AXES,
    MeshAxis,
    axis_size,
    mesh_shape,
    rank_coordinates,
)

CASES = [  # (world size, SMP parameters)
    (8, {}),
    (8, {"tensor_parallel_degree": 2}),
    (8, {"hybrid_shard_degree": 2, "tensor_parallel_degree": 2}),
    (8, {"hybrid_shard_degree": 4, "expert_parallel_degree": 2}),
    (8, {"expert_parallel_degree": 4}),
    (8, {"sharding_strategy": "no_shard"}),
    (4, {"hybrid_shard_degree": 1, "tensor_parallel_degree": 4}),
    # EP folded over shard x tp (issue 32)
    (8, {"tensor_parallel_degree": 2, "expert_parallel_degree": 2}),
    (8, {"hybrid_shard_degree": 2, "tensor_parallel_degree": 2, "expert_parallel_degree": 4}),
]

# Hand-made degrees (pp, replicate, shard, tp, cp, ep) on 8 ranks: what [pipeline] / [context]
# will resolve; the mesh already holds their axes.
HAND_MADE = [
    (2, 1, 4, 1, 1, 1),
    (2, 2, 2, 1, 1, 1),
    (2, 1, 2, 2, 2, 1),
    (1, 2, 4, 1, 2, 1),
    (1, 1, 4, 2, 4, 1),
    (2, 1, 4, 1, 2, 2),
]


def hand_made(pp: int, rep: int, shard: int, tp: int, cp: int, ep: int) -> dict:
    return {"world_size": pp * rep * shard * tp, "replicate_degree": rep,
            "hybrid_shard_degree": shard, "tensor_parallel_degree": tp,
            "context_parallel_degree": cp, "expert_parallel_degree": ep,
            "sharding_strategy": "full_shard", "pipeline_parallel_degree": pp}

PLAYER = r"""
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from meshtrain.contract import ResolvedDegrees, SMPParameters, resolve_degrees
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain_runtime.mesh import build_meshes

def ranks(mesh):
    return None if mesh is None else mesh.mesh.tolist()

def named(mesh):
    return None if mesh is None else [list(mesh.mesh_dim_names), ranks(mesh)]

out = []
for world, params in json.loads(sys.argv[1]):
    if "degrees" in params:
        degrees = ResolvedDegrees(**params["degrees"])
    else:
        degrees = resolve_degrees(SMPParameters(**params), world)
    for rank in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
        m = build_meshes(degrees, "cpu")
        out.append({
            "world": world, "params": params, "rank": rank,
            "world_mesh": named(m.world), "dense": named(m.dense), "expert": named(m.expert),
            "tp": ranks(m.submesh(MeshAxis.TP)),
            "hsdp": ranks(m.submesh(MeshAxis.REPLICATE, MeshAxis.SHARD)),
            "dp": named(m.dp), "replica": named(m.replica),
            "layout": named(m.layout), "context": named(m.context),
            "cp": ranks(m.submesh(MeshAxis.CP)), "pp": ranks(m.submesh(MeshAxis.PP)),
            "coords": {a.value: m.coordinate(a) for a in MeshAxis},
        })
        dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def records() -> list[dict]:
    cases = CASES + [(8, {"degrees": hand_made(*case)}) for case in HAND_MADE]
    result = subprocess.run(
        [sys.executable, "-c", PLAYER, json.dumps(cases)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(rows) == sum(world for world, _ in cases)
    return rows


def _expected_coords(rank: int, r: int, s: int, tp: int, ep: int) -> dict[str, int]:
    t, rest = rank % tp, rank // tp
    shard, replicate = rest % s, rest // s
    return {
        "world": rank, "replicate": replicate, "shard": shard, "tp": t,
        # ep is folded over shard x tp with TP; without EP, shard_mod_ep is the shard axis
        "shard_mod_ep": (shard * tp + t if ep > 1 else shard) // ep,
        "ep": (shard * tp + t if ep > 1 else shard) % ep,
        "dp": replicate * s + shard, "replica": shard * tp + t,
        "pp": 0, "shard_mod_cp": shard, "cp": 0,  # the axes pp and cp, at size 1
    }


@pytest.mark.parametrize(("world", "params"), CASES, ids=[str(c) for c in CASES])
def test_layouts_and_views(records: list[dict], world: int, params: dict) -> None:
    degrees = resolve_degrees(SMPParameters(**params), world)
    r, s, tp = mesh_shape(degrees, DENSE_AXES)
    ep = degrees.expert_parallel_degree
    dense = [[[(i * s + j) * tp + k for k in range(tp)] for j in range(s)] for i in range(r)]
    rows = [row for row in records if row["world"] == world and row["params"] == params]
    assert [row["rank"] for row in rows] == list(range(world))
    for row in rows:
        rank = row["rank"]
        c = _expected_coords(rank, r, s, tp, ep)
        assert row["world_mesh"] == [["world"], list(range(world))]
        assert row["dense"] == [["replicate", "shard", "tp"], dense]
        assert row["tp"] == dense[c["replicate"]][c["shard"]]
        assert row["hsdp"] == [[plane[j][c["tp"]] for j in range(s)] for plane in dense]
        assert row["dp"] == [["dp"], [x for plane in dense for x in (v[c["tp"]] for v in plane)]]
        assert row["replica"] == [["replica"], [x for v in dense[c["replicate"]] for x in v]]
        assert row["coords"] == c
        if ep == 1:
            assert row["expert"] is None
            continue
        # ep folded over the shard x tp ranks of a replica (tp innermost)
        expert = [[[i * s * tp + j * ep + e for e in range(ep)] for j in range(s * tp // ep)]
                  for i in range(r)]
        assert row["expert"] == [["replicate", "shard_mod_ep", "ep"], expert]
        assert list(mesh_shape(degrees, EXPERT_AXES)) == [r, s * tp // ep, ep]


def test_axis_sizes_follow_the_degrees() -> None:
    degrees = resolve_degrees(
        SMPParameters(hybrid_shard_degree=4, expert_parallel_degree=2), 16
    )
    sizes = {axis: axis_size(degrees, axis) for axis in MeshAxis}
    assert sizes == {
        MeshAxis.WORLD: 16, MeshAxis.REPLICATE: 4, MeshAxis.SHARD: 4, MeshAxis.TP: 1,
        MeshAxis.SHARD_MOD_EP: 2, MeshAxis.EP: 2, MeshAxis.DP: 16, MeshAxis.REPLICA: 4,
        MeshAxis.PP: 1, MeshAxis.SHARD_MOD_CP: 4, MeshAxis.CP: 1,  # the axes pp and cp, at size 1
    }
    assert mesh_shape(degrees) == (4, 4, 1)  # the dense layout by default


@pytest.mark.parametrize(
    "case", HAND_MADE, ids=["pp{}-r{}-s{}-tp{}-cp{}-ep{}".format(*c) for c in HAND_MADE]
)
def test_pipeline_and_context_axes(records: list[dict], case: tuple[int, ...]) -> None:
    pp, rep, shard, tp, cp, ep = case
    degrees = ResolvedDegrees(**hand_made(*case))
    rows = [row for row in records if row["params"] == {"degrees": hand_made(*case)}]
    assert [row["rank"] for row in rows] == list(range(8))
    stage = rep * shard * tp
    layout = [[[[((p * rep + i) * shard + j) * tp + k for k in range(tp)] for j in range(shard)]
               for i in range(rep)] for p in range(pp)]
    rows_of_dp: dict[int, list[int]] = {}
    for row in rows:
        rank = row["rank"]
        p, rest = divmod(rank, stage)
        t, rest = rank % tp, rest // tp
        r, s = divmod(rest, shard)
        expected = {
            "world": rank, "pp": p, "replicate": r, "shard": s, "tp": t,
            "shard_mod_cp": s // cp, "cp": s % cp, "shard_mod_ep": s // ep, "ep": s % ep,
            "dp": r * shard + s, "replica": s * tp + t,
        }
        assert row["coords"] == expected
        assert {a.value: v for a, v in rank_coordinates(degrees, rank).items()} == expected
        assert row["layout"] == [["pp", "replicate", "shard", "tp"], layout]
        assert row["dense"] == [["replicate", "shard", "tp"], layout[p]]  # this stage's view
        assert row["pp"] == [layout[q][r][s][t] for q in range(pp)]
        assert row["cp"] == [layout[p][r][s - s % cp + c][t] for c in range(cp)]
        cp_view = [[[[layout[p][i][j * cp + c][k] for k in range(tp)] for c in range(cp)]
                    for j in range(shard // cp)] for i in range(rep)]
        assert row["context"] == [["replicate", "shard_mod_cp", "cp", "tp"], cp_view]
        rows_of_dp.setdefault((r * shard + s) // cp, []).append(rank)  # dp_rank = dp // cp
    # dp_size = world / (pp x tp x cp) row indices, each read by the pp x tp x cp ranks that
    # differ only in stage, tp and cp coordinates
    assert degrees.dp_size == 8 // (pp * tp * cp)
    assert sorted(rows_of_dp) == list(range(degrees.dp_size))
    assert all(len(ranks) == pp * tp * cp for ranks in rows_of_dp.values())


def test_hand_made_degrees_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="pp 2 x replicate 1 x shard 2 x tp 1 is not the world"):
        ResolvedDegrees(**{**hand_made(2, 1, 2, 1, 1, 1), "world_size": 8})
    with pytest.raises(ValueError, match="cp 4 does not divide the sharding group 2"):
        ResolvedDegrees(**hand_made(2, 1, 2, 2, 4, 1))
