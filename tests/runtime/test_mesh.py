"""meshtrain_runtime.mesh: one world mesh and its views, for several degree combinations.

One subprocess plays every rank of 8- and 4-rank worlds in turn on torch's fake process group
(no collectives run; DeviceMesh bookkeeping is real) and reports each rank's meshes; the
expected layout is computed here from the rank formula ``rank = (replicate * shard + s) * tp + t``
(and ``s = shard_mod_ep * ep + e`` with expert parallelism). Real gloo groups are checked in
test_hsdp_layouts.py::test_state_coordinates_and_groups.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.contract.mesh_axes import DENSE_AXES, EXPERT_AXES, MeshAxis, axis_size, mesh_shape

CASES = [  # (world size, SMP parameters)
    (8, {}),
    (8, {"tensor_parallel_degree": 2}),
    (8, {"hybrid_shard_degree": 2, "tensor_parallel_degree": 2}),
    (8, {"hybrid_shard_degree": 4, "expert_parallel_degree": 2}),
    (8, {"expert_parallel_degree": 4}),
    (8, {"sharding_strategy": "no_shard"}),
    (4, {"hybrid_shard_degree": 1, "tensor_parallel_degree": 4}),
]

PLAYER = r"""
import json, sys
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from meshtrain.contract import SMPParameters, resolve_degrees
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain_runtime.mesh import build_meshes

def ranks(mesh):
    return None if mesh is None else mesh.mesh.tolist()

def named(mesh):
    return None if mesh is None else [list(mesh.mesh_dim_names), ranks(mesh)]

out = []
for world, params in json.loads(sys.argv[1]):
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
            "coords": {a.value: m.coordinate(a) for a in MeshAxis},
        })
        dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def records() -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-c", PLAYER, json.dumps(CASES)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(rows) == sum(world for world, _ in CASES)
    return rows


def _expected_coords(rank: int, r: int, s: int, tp: int, ep: int) -> dict[str, int]:
    t, rest = rank % tp, rank // tp
    shard, replicate = rest % s, rest // s
    return {
        "world": rank, "replicate": replicate, "shard": shard, "tp": t,
        "shard_mod_ep": shard // ep, "ep": shard % ep,
        "dp": replicate * s + shard, "replica": shard * tp + t,
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
        expert = [[[i * s + j * ep + e for e in range(ep)] for j in range(s // ep)]
                  for i in range(r)]
        assert row["expert"] == [["replicate", "shard_mod_ep", "ep"], expert]
        assert list(mesh_shape(degrees, EXPERT_AXES)) == [r, s // ep, ep]


def test_axis_sizes_follow_the_degrees() -> None:
    degrees = resolve_degrees(
        SMPParameters(hybrid_shard_degree=4, expert_parallel_degree=2), 16
    )
    sizes = {axis: axis_size(degrees, axis) for axis in MeshAxis}
    assert sizes == {
        MeshAxis.WORLD: 16, MeshAxis.REPLICATE: 4, MeshAxis.SHARD: 4, MeshAxis.TP: 1,
        MeshAxis.SHARD_MOD_EP: 2, MeshAxis.EP: 2, MeshAxis.DP: 16, MeshAxis.REPLICA: 4,
    }
    assert mesh_shape(degrees) == (4, 4, 1)  # the dense layout by default
