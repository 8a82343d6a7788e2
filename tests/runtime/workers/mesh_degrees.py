"""State on real gloo ranks for degrees the parameters cannot express yet (pp / cp > 1).

Each case builds the runtime state from hand-made ResolvedDegrees (test_state.py lists them)
and reports every coordinate, size and group, plus an all-reduce of the global ranks over each
of the pp, cp and dp groups (real collectives on the world mesh's groups).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from report import report

import meshtrain_runtime as mr
from meshtrain.contract import ResolvedDegrees, SMPParameters
from meshtrain_runtime.state import build_state


def _ranks(group: dist.ProcessGroup) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


def _sum_of_ranks(group: dist.ProcessGroup) -> int:
    value = torch.tensor([dist.get_rank()])
    dist.all_reduce(value, group=group)
    return int(value.item())


def main() -> None:
    mr.init()  # starts the process group
    for degrees in json.loads(sys.argv[1]):
        st = build_state(SMPParameters(), device=torch.device("cpu"),
                         degrees=ResolvedDegrees(**degrees))
        dp_group = st.meshes.dp.get_group()
        report({
            "degrees": degrees,
            **{key: getattr(st, key) for key in (
                "pp_rank", "pp_size", "cp_rank", "cp_size", "dp_rank", "dp_size", "tp_rank",
                "shard_rank", "replicate_rank", "pipeline_parallel_degree",
            )},
            "pp_group": _ranks(st.pp_process_group), "cp_group": _ranks(st.cp_process_group),
            "tp_group": _ranks(st.tp_process_group), "dp_group": _ranks(dp_group),
            "mesh": [list(st.mesh.mesh_dim_names), st.mesh.mesh.tolist()],
            "sums": [_sum_of_ranks(g) for g in (st.pp_process_group, st.cp_process_group,
                                                dp_group)],
        })
    mr.reset()


if __name__ == "__main__":
    main()
