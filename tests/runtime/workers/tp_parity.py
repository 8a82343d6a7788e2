"""Worker: tensor parallelism (alone, or under FSDP2) vs the single-process run.

Usage (through tests/runtime/conftest.py's run_torchrun):
    tp_parity.py CASE [CASE ...] [--checks]
CASE is ``model/RxSxT[/sp][/lp]``: model llama|llama_tied|neox|mixtral|custom|plain|plain_min, mesh
(replicate, shard, tp) whose product is the world size, sp = sequence parallel, lp = loss
parallel. ``--checks`` also runs tp_checks (2 ranks). Rank 0 reports one record per case
(``{"case": ...}``) and one ``{"checks": ...}``.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.distributed as dist
import tp_models as models
from report import report
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from meshtrain_runtime.parallel.tensor import apply_tensor_parallel

_MESHES: dict[tuple[int, int, int], DeviceMesh] = {}
_REFERENCES: dict[tuple[str, int], list[float]] = {}


def parse_case(case: str) -> dict:
    kind, shape, *flags = case.split("/")
    replicate, shard, tp = (int(n) for n in shape.split("x"))
    return {"kind": kind, "mesh": (replicate, shard, tp), "sp": "sp" in flags,
            "lp": "lp" in flags}


def mesh_for(shape: tuple[int, int, int]) -> DeviceMesh:
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape,
                                          mesh_dim_names=("replicate", "shard", "tp"))
    return _MESHES[shape]


def tp_placements(model: torch.nn.Module) -> dict[str, str]:
    """The placement on the tp axis of every parameter (under FSDP2: of its 2-D/3-D DTensor)."""
    out = {}
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            out[name] = "plain tensor"
            continue
        names = param.device_mesh.mesh_dim_names or ()
        axis = names.index("tp") if "tp" in names else 0
        out[name] = repr(param.placements[axis])
    return out


def run_case(case: str) -> dict:
    spec = parse_case(case)
    replicate, shard, tp = spec["mesh"]
    mesh = mesh_for(spec["mesh"])
    model = models.build_model(spec["kind"])
    plan = models.plan_for(spec["kind"])
    apply_tensor_parallel(model, mesh["tp"], plan=plan, sequence_parallel=spec["sp"],
                          loss_parallel=spec["lp"])
    dp_degree = replicate * shard
    if dp_degree > 1:  # as transform will: fully_shard on the blocks, then the root
        dp_mesh = mesh["shard"] if replicate == 1 else mesh["replicate", "shard"]
        for block in models.blocks_of(model):
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    placements = tp_placements(model)
    dp_rank = dist.get_rank() // tp  # tp ranks are contiguous; all of them see the same batch
    lo, hi = dp_rank * models.LOCAL_BATCH, (dp_rank + 1) * models.LOCAL_BATCH

    def batch_of(step: int) -> torch.Tensor:
        return models.global_batch(dp_degree, step)[lo:hi]

    losses = models.train(model, batch_of, parallel_loss=spec["lp"])
    key = (spec["kind"], dp_degree)
    if key not in _REFERENCES:
        _REFERENCES[key] = models.reference_losses(spec["kind"], dp_degree)
    reference = _REFERENCES[key]
    return {
        "losses": losses,
        "reference": reference,
        "max_abs_error": max(abs(a - b) for a, b in zip(losses, reference, strict=True)),
        "placements": placements,
        "head": _output_head(model),
    }


def _output_head(model: torch.nn.Module) -> str | None:
    """The output projection's weight name (GPT-NeoX's is `embed_out` before transformers
    5.14, `lm_head` after)."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    names = {id(module): name for name, module in model.named_modules()}
    return f"{names[id(head)]}.weight" if head is not None else None


def main() -> None:
    cases = sys.argv[1:]
    checks = "--checks" in cases
    cases = [case for case in cases if case != "--checks"]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo")
    leader = dist.get_rank() == 0
    for case in cases:
        try:
            result = run_case(case)
        except Exception as error:  # record and go on: one failing layout must not hide others
            result = {"error": "".join(traceback.format_exception(error))}
        if leader:
            report({"case": case, **result})
    if checks:
        import tp_checks

        result = tp_checks.run_all(mesh_for((1, 1, dist.get_world_size()))["tp"])
        if leader:
            report({"checks": result})


if __name__ == "__main__":
    main()
