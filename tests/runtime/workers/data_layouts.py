"""The loader on real layouts, reading its coordinates from init(): ``four DIR CORPUS`` on 4
ranks, then ``two DIR CORPUS`` on 2 (tests/runtime/test_data_layouts.py).

Every case builds the same tiny Llama (seed 0), trains it with AdamW on
``meshtrain_runtime.data.loader(CORPUS, global_batch_size=8, seq_len=16, steps=8)`` and every
rank reports, per step, the samples it was handed (inputs + the last target) and the global
batch's loss. Cases that save do so with the loader (``save_checkpoint(..., loader=)``); cases
that resume load with it and loop on: the script has no step arithmetic, the loader knows where
it is.

four: dp4 (8 steps, saves after 4), dp4 with 2 DataLoader workers (rows only), tp2 x dp2 (6
steps, saves after 4), dp4 resuming tp2 x dp2's checkpoint (dp 2 -> 4), pp2 x dp2 (6 steps,
saves after 4), cp2 x dp2 (rows only: examples/llama_context trains on the loader with cp).
two: dp2 resuming dp4's checkpoint (saves again after 6, the end of the first epoch), dp2
resuming that one (a job resumed twice, at the epoch boundary), dp2 resuming pp2 x dp2's, and
dp2 with 0 and 2 workers (rows only).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from data_model import build, loss_fn, samples
from report import report

import meshtrain_runtime as mr

GLOBAL_BATCH, SEQ_LEN, STEPS, SAVE_AT = 8, 16, 8, 4
PP2 = {"pipeline_parallel_degree": 2, "hybrid_shard_degree": 2, "microbatches": 2}


def coordinates() -> dict[str, int]:
    st = mr.state
    return {name: getattr(st, name) for name in ("dp_rank", "dp_size", "tp_rank", "pp_rank",
                                                   "cp_rank")}


def train(case: str, parameters: dict[str, Any], corpus: str, *, stop: int = STEPS,
          load: Path | None = None, save: Path | None = None, save_at: int = SAVE_AT) -> None:
    """Train from the loader until it has handed out `stop` batches (or its end)."""
    mr.init(parameters)
    model = mr.transform(build())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = mr.data.loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN,
                            steps=STEPS)
    if load is not None:
        mr.load_checkpoint(load, model, optimizer, loader=loader)
    steps = []
    for inputs, targets in loader:
        loss = mr.forward_backward(model, inputs, targets, loss_fn=loss_fn)
        optimizer.step()
        optimizer.zero_grad()
        steps.append({"step": loader.step - 1, "samples": samples(inputs, targets),
                      "loss": mr.global_mean(loss)})
        if save is not None and loader.step == save_at:
            mr.save_checkpoint(save, model, optimizer, step=save_at, loader=loader)
        if loader.step == stop:
            break
    report({"case": case, **coordinates(), "steps": steps})
    mr.reset()


def rows_only(case: str, corpus: str, num_workers: int = 0,
              parameters: dict[str, Any] | None = None) -> None:
    """The rows of 6 steps without a model (DataLoader workers prepare them)."""
    mr.init(parameters or {})
    loader = mr.data.loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN,
                            steps=6, num_workers=num_workers)
    steps = [{"step": loader.step - 1, "samples": samples(x, y)} for x, y in loader]
    report({"case": case, **coordinates(), "steps": steps})
    mr.reset()


def four(directory: Path, corpus: str) -> None:
    train("dp4", {}, corpus, save=directory / "dp4")
    rows_only("dp4_workers2", corpus, num_workers=2)
    train("tp2xdp2", {"tensor_parallel_degree": 2}, corpus, stop=6, save=directory / "tp2")
    train("dp2_to_dp4", {}, corpus, load=directory / "tp2")
    train("pp2xdp2", PP2, corpus, stop=6, save=directory / "pp2")
    rows_only("cp2xdp2", corpus, parameters={"context_parallel_degree": 2})


def two(directory: Path, corpus: str) -> None:
    train("dp4_to_dp2", {}, corpus, load=directory / "dp4", save=directory / "dp2_at6",
          save_at=6)
    train("resumed_twice", {}, corpus, load=directory / "dp2_at6")
    train("pp2xdp2_to_dp2", {}, corpus, load=directory / "pp2")
    rows_only("dp2_workers0", corpus, num_workers=0)
    rows_only("dp2_workers2", corpus, num_workers=2)


if __name__ == "__main__":
    {"four": four, "two": two}[sys.argv[1]](Path(sys.argv[2]), sys.argv[3])
