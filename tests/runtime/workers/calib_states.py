"""Per-rank model-state bytes after one real AdamW step, for the planner's calibration.

Runs inside calib_launch.py's launch and loops over layouts (``mr.init`` -> build -> one step
-> ``mr.reset`` each). Every rank reports, per case, the bytes of the distinct storages behind
its parameters, gradients and AdamW moments, and the collectives of its forward and backward.
4 ranks: full shard, full shard in bf16 mixed precision, hybrid 2x2, tp 2 x shard 2, and ep 2
on a tiny Mixtral (shard 4 = shard_mod_ep 2 x ep 2). 2 ranks: full shard, tp 2 alone, and full
shard with ``reshard_after_forward: false`` (groups keep their gathered parameters until
backward).
tests/runtime/test_plan_calibration_multiprocess.py compares them with the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from calib_support import (
    build_model,
    collectives_of,
    config_record,
    llama_config,
    mixtral_config,
    model_state_bytes,
    smaller_phase_peaks,
)
from report import report

import meshtrain_runtime as mr

SEQ, LOCAL_BATCH = 16, 2

# case -> (SMP parameters, model config builder)
CASES: dict[int, dict[str, tuple[dict[str, Any], Callable[[], Any]]]] = {
    2: {
        "full_shard_2": ({}, llama_config),
        "tp2": ({"tensor_parallel_degree": 2}, llama_config),
        "full_shard_2_keep": ({"reshard_after_forward": False}, llama_config),
    },
    4: {
        "full_shard_4": ({}, llama_config),
        "full_shard_4_bf16": ({"mixed_precision": "bf16"}, llama_config),
        "hybrid_2x2": ({"hybrid_shard_degree": 2}, llama_config),
        "tp2_shard2": ({"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}, llama_config),
        "ep2_shard4": ({"hybrid_shard_degree": 4, "expert_parallel_degree": 2}, mixtral_config),
    },
}


def one_step(
    model: torch.nn.Module, dp_rank: int, *, count: bool
) -> tuple[torch.optim.Optimizer, dict | None]:
    """Forward and backward (collectives counted when `count`), then one AdamW step, on this
    data-parallel rank's tokens."""
    generator = torch.Generator().manual_seed(100 + dp_rank)
    ids = torch.randint(0, model.config.vocab_size, (LOCAL_BATCH, SEQ), generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward_backward() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    collectives = collectives_of(forward_backward) if count else None
    if not count:
        forward_backward()
    optimizer.step()
    return optimizer, collectives


def run_case(case: str, params: dict[str, Any], make_config: Callable[[], Any]) -> None:
    mr.init(params)
    config = make_config()
    model = mr.transform(build_model(config))
    # torch's CommDebugMode fails on the expert-parallel Mixtral (IndexError in its module
    # tracker's forward hook; a plain Mixtral is fine), and EP's all-to-all volume follows the
    # router's choices rather than the planner's uniform routing: EP's collectives go uncounted.
    count = mr.state.expert_parallel_degree == 1
    optimizer, collectives = one_step(model, mr.state.dp_rank, count=count)
    measured = model_state_bytes(model, optimizer)
    # A second step, phase by phase, as a script runs it: zero_grad(set_to_none=True) first.
    optimizer.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(300 + mr.state.dp_rank)
    ids = torch.randint(0, config.vocab_size, (LOCAL_BATCH, SEQ), generator=generator)
    phases = smaller_phase_peaks(model, ids, optimizer)
    report({
        "case": case,
        "params": params,
        "world_size": dist.get_world_size(),
        "config": config_record(config),
        "seq_len": SEQ,
        "micro_batch": LOCAL_BATCH,
        "measured": measured,
        "phases": phases,
        "collectives": collectives,
    })
    mr.reset()


def run_state_cases(world_size: int) -> None:
    """Every model-state case of this world size, one after the other."""
    for case, (params, make_config) in CASES[world_size].items():
        run_case(case, params, make_config)
