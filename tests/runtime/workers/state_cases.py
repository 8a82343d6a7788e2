"""Multi-rank `init()` / `state` cases (run inside hsdp_layouts.py's launch to save a torchrun).

For tensor-, expert- and context-parallel layouts: the coordinates, meshes and groups `state`
reports, and the ConfigError `transform` raises for a custom model that has no tensor-parallel
plan and no MoE layers (and for context parallelism, not in this build), before touching it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from hsdp_support import build_custom
from report import report
from torch.distributed.tensor import DTensor

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError

STATE_LAYOUTS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "default": {},
        "tp2": {"tensor_parallel_degree": 2},
        "ep2": {"expert_parallel_degree": 2},
        "cp2": {"context_parallel_degree": 2},
    },
    4: {
        "hybrid_2x2": {"hybrid_shard_degree": 2},
        "tp2": {"tensor_parallel_degree": 2, "random_seed": 5},
        "ep2": {"expert_parallel_degree": 2},
        "hybrid_ep2": {"hybrid_shard_degree": 2, "expert_parallel_degree": 2},
    },
}


def _ranks(group: dist.ProcessGroup | None) -> list[int] | None:
    return None if group is None else sorted(dist.get_process_group_ranks(group))


def _mesh(mesh: Any) -> dict[str, Any] | None:
    if mesh is None:
        return None
    return {
        "names": list(mesh.mesh_dim_names),
        "shape": list(mesh.shape),
        "coordinate": mesh.get_coordinate(),
    }


def _transform_error() -> tuple[str | None, bool]:
    """(the ConfigError transform raised or None, whether the model was left as it was)."""
    model = build_custom()
    try:
        mr.transform(model)
    except ConfigError as error:
        untouched = not any(isinstance(p, DTensor) for p in model.parameters())
        return str(error), untouched
    return None, False


def run_state_cases(world: int) -> None:
    for name, params in STATE_LAYOUTS[world].items():
        st = mr.init(params)
        error, untouched = _transform_error()
        report(
            {
                "case": "state",
                "layout": name,
                "world_size": st.world_size,
                "mesh": _mesh(st.mesh),
                "expert_mesh": _mesh(st.expert_mesh),
                **{
                    key: getattr(mr.state, key)
                    for key in (
                        "tp_rank", "tp_size", "ep_rank", "ep_size", "cp_rank", "cp_size",
                        "dp_rank", "dp_size", "shard_rank", "replicate_rank",
                        "hybrid_shard_degree", "replicate_degree", "random_seed",
                        "sharding_strategy",
                    )
                },
                "tp_group": _ranks(st.tp_process_group),
                "ep_group": _ranks(st.ep_process_group),
                "rep_rank_group": _ranks(st.rep_rank_process_group),
                "world_group": _ranks(st.world_process_group),
                "transform_error": error,
                "model_untouched": untouched,
            }
        )
        mr.reset()
