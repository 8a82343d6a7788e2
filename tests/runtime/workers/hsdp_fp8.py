"""`fp8: true` on gloo ranks (4-rank launch of hsdp_layouts.py): FSDP2 with float8 all-gather vs
one process that runs each rank's rows as a micro-batch of its own.

Float8's tensorwise dynamic scaling scales each matmul input by its own amax, so data-parallel
ranks quantize their own rows: a single-process reference over the whole global batch would
quantize differently. The reference therefore accumulates the gradients of every rank's rows,
1/dp_size each (a power of two: the float8 scales, set by amax, see exactly the same values),
before each step. Weight scales come from the whole weight on both sides: FSDP2's float8
all-gather all-reduces the shards' amax. CPU has no float8 tensor cores, so transform() refuses
fp8 here; torch's CPU `_scaled_mm` computes float8 matmuls, so the device check is switched off.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from hsdp_support import LR, STEPS, build_llama, dataset, local_rows, loss_of, train
from report import RESULTS_ENV, report

import meshtrain_runtime as mr

DP_SIZE = 4
LAYOUTS = {"full_shard": {}, "hybrid_2x2": {"hybrid_shard_degree": 2}}


def run_fp8_cases() -> None:
    try:
        import torchao  # noqa: F401
    except ImportError:
        report({"case": "fp8", "skipped": "torchao is not installed"})
        return
    from meshtrain_runtime import parallelize

    parallelize.check_fp8 = lambda enabled, device: None  # see the module docstring
    if int(os.environ["RANK"]) == 0:
        report({"case": "fp8_reference", "losses": _micro_batch_reference()})
    for layout, params in LAYOUTS.items():
        _run_layout(layout, params)
    _resume_on_another_layout()


def _micro_batch_reference() -> list[float]:
    """One process, float8 linears, every rank's rows as a micro-batch (no process group use)."""
    from meshtrain_runtime.parallel.float8 import apply_float8

    model = build_llama()
    apply_float8(model, list(model.model.layers), fsdp_float8_all_gather=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)  # as hsdp_support.train
    rows = [local_rows(dataset(), rank, DP_SIZE) for rank in range(DP_SIZE)]
    batch = rows[0].size(0) // STEPS
    losses = []
    for step in range(STEPS):
        total = 0.0
        for part in rows:
            loss = loss_of(model, part[step * batch:(step + 1) * batch])
            (loss / DP_SIZE).backward()
            total += float(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total / DP_SIZE)
    return losses


def _run_layout(layout: str, params: dict[str, Any]) -> None:
    mr.init({"fp8": True, **params})
    st = mr.state
    model = mr.transform(build_llama())
    up = model.model.layers[0].mlp.up_proj
    result = train(model, local_rows(dataset(), st.dp_rank, st.dp_size), dp_size=st.dp_size)
    report({"case": "fp8", "layout": layout, "dp_size": st.dp_size,
            "linear_type": type(up).__name__,
            "weight_type": type(up.weight.to_local()).__name__, **result})
    mr.reset()


def _resume_on_another_layout() -> None:
    """Save a trained fp8 full-shard model, load it into fp8 hybrid 2x2: the same loss."""
    rows = local_rows(dataset(), 0, 1)[:2]  # one batch, the same on every rank
    folder = os.path.join(os.environ[RESULTS_ENV], "fp8-checkpoint")
    mr.init({"fp8": True})
    saved = mr.transform(build_llama())
    optimizer = torch.optim.AdamW(saved.parameters(), lr=1e-2)
    loss_of(saved, rows).backward()
    optimizer.step()
    mr.save_checkpoint(folder, model=saved, optimizer=optimizer, step=1)
    expected = float(loss_of(saved, rows).detach())
    mr.reset()
    mr.init({"fp8": True, "hybrid_shard_degree": 2})
    loaded = mr.transform(build_llama(seed=7))
    mr.load_checkpoint(folder, model=loaded, optimizer=torch.optim.AdamW(loaded.parameters()))
    report({"case": "fp8_resume", "expected": expected,
            "loaded": float(loss_of(loaded, rows).detach())})
    mr.reset()
