"""Every sharding layout for this world size vs a single-process run, in one torchrun launch.

2 ranks: full shard. 4 ranks: full shard, hybrid 2x2, no_shard, shard_grad_op; plus delayed
(meta-device) initialisation, loading from rank 0, a degree that does not divide the world, and
fp8 (float8 linears, FSDP2's float8 all-gather; hsdp_fp8.py).
Each case reports JSON records (see report.py); tests/runtime/test_hsdp_layouts.py asserts.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from hsdp_delayed import run_delayed_cases
from hsdp_fp8 import run_fp8_cases
from hsdp_support import (
    build_custom,
    build_llama,
    dataset,
    local_rows,
    loss_of,
    memory_accounting,
    placements_summary,
    train,
)
from report import report
from state_cases import run_state_cases
from torch.distributed.tensor import DTensor

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime.grad import total_grad_norm

LAYOUTS: dict[int, dict[str, dict[str, Any]]] = {
    2: {"full_shard": {}},
    4: {
        "full_shard": {},
        "hybrid_2x2": {"hybrid_shard_degree": 2},
        "no_shard": {"hybrid_shard_degree": 1},
        "shard_grad_op": {"sharding_strategy": "shard_grad_op"},
    },
}
MODELS = {"llama": build_llama, "custom": build_custom}
CLIP = 0.05  # small enough that every step clips


def report_references(tokens: torch.Tensor) -> None:
    """Single-process runs (no process group involved) of every model, with and without clip."""
    for name, build in MODELS.items():
        for clip in (None, CLIP):
            result = train(build(), tokens, dp_size=1, clip=clip, clip_fn=_torch_clip)
            report({"case": "reference", "model": name, "clip": clip, **result})


def _torch_clip(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def run_layout(layout: str, params: dict[str, Any], name: str, clip: float | None) -> None:
    mr.init(params)
    st = mr.state
    model = mr.transform(MODELS[name]())
    summary = placements_summary(model)
    memory: dict[str, int] = {}

    def on_last_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        memory.update(memory_accounting(model, optimizer))

    rows = local_rows(dataset(), st.dp_rank, st.dp_size)
    result = train(
        model, rows, dp_size=st.dp_size, clip=clip, clip_fn=mr.clip_grad_norm_,
        on_last_step=on_last_step,
    )
    report(
        {
            "case": "layout",
            "layout": layout,
            "model": name,
            "clip": clip,
            "strategy": st.sharding_strategy,
            "shard_degree": st.hybrid_shard_degree,
            "replicate_degree": st.replicate_degree,
            "shard_rank": st.shard_rank,
            "replicate_rank": st.replicate_rank,
            "dp_rank": st.dp_rank,
            "dp_size": st.dp_size,
            "reshard_after_forward": _block_reshards(model),
            "local_sum": sum(float(_local_sum(p)) for p in model.parameters()),
            "memory": memory,
            **summary,
            **result,
        }
    )
    mr.reset()


def _local_sum(p: torch.Tensor) -> torch.Tensor:
    return (p.to_local() if isinstance(p, DTensor) else p).detach().double().sum()


def _block_reshards(model: torch.nn.Module) -> list[bool]:
    """FSDP2's reshard-after-forward setting of each block group (post_forward_mesh_info)."""
    flags = []
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        if group is not None and module is not model:
            flags.append(group.post_forward_mesh_info is not None)
    return flags


def report_norm_types(layout: str, params: dict[str, Any]) -> None:
    """Total gradient norm of order 1, 2 and inf vs the norm of the gathered full gradients."""
    mr.init(params)
    model = mr.transform(build_llama())
    rows = local_rows(dataset(), mr.state.dp_rank, mr.state.dp_size)
    loss_of(model, rows[:2]).backward()
    grads = [p.grad for p in model.parameters()]
    full = [g.full_tensor() for g in grads]
    errors = {}
    for norm_type in (1.0, 2.0, math.inf):
        ours = float(total_grad_norm(grads, norm_type))
        expected = float(torch.nn.utils.get_total_norm(full, norm_type))
        errors[str(norm_type)] = abs(ours - expected) / expected
    report({"case": "norm_types", "layout": layout, "relative_errors": errors})
    mr.reset()


def report_bad_degree() -> None:
    try:
        mr.init({"hybrid_shard_degree": 3})
        report({"case": "bad_degree", "error": None})
    except ConfigError as error:
        report({"case": "bad_degree", "error": str(error), "type": type(error).__name__})
    mr.reset()


def main() -> None:
    world = int(os.environ["WORLD_SIZE"])
    if int(os.environ["RANK"]) == 0:
        report_references(dataset())
    for layout, params in LAYOUTS[world].items():
        for name in MODELS:
            for clip in (None, CLIP):
                run_layout(layout, params, name, clip)
        report_norm_types(layout, params)
    report_bad_degree()
    run_state_cases(world)
    if world == 4:
        run_delayed_cases()
        run_fp8_cases()


if __name__ == "__main__":
    main()
