"""A hybrid-sharded training script whose loop goes by the job's step, run by
tests/e2e/test_fault_tolerance_long.py as an Estimator job with ``fault_tolerance``.

``fault.step_to_run()`` says which step comes next (a restarted group heals there and reads that
step's rows), and every group's loop ends at the job's --total-steps. With --checkpoint-every K
it saves a checkpoint after every K-th committed step (``save_checkpoint`` writes each step once:
one group's ranks write, the others skip) and, when the job's checkpoint folder has one, starts
from the latest (a group that comes back after every group was lost resumes there).

Each rank writes ``ft-steps-dp<dp_rank>.jsonl`` into its host's output data dir: one line per
step (the step it ran as, its loss, the committed steps after it).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

import meshtrain_runtime as mr
from meshtrain_runtime import fault

FEATURES = 8
ROWS = 4  # per data-parallel rank and step
INIT_SEED = 0
LR = 0.05


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(2))
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def batch(dp_rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of data-parallel rank `dp_rank` at the job's step `step` (the test replays them)."""
    generator = torch.Generator().manual_seed(1000 * step + dp_rank)
    return (torch.randn(ROWS, FEATURES, generator=generator),
            torch.randn(ROWS, 1, generator=generator))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total-steps", type=int, default=600)
    parser.add_argument("--delay", type=float, default=0.0)  # seconds of "data loading" a step
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args, _ = parser.parse_known_args()
    state = mr.init()
    torch.manual_seed(INIT_SEED)
    model = mr.transform(Tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    if args.checkpoint_every and mr.latest_checkpoint() is not None:
        mr.load_checkpoint(None, model, optimizer)  # every group was lost: resume here
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    lines = (out / f"ft-steps-dp{state.dp_rank}.jsonl").open("a")
    saved = fault.current_step()
    while (step := fault.step_to_run()) < args.total_steps:
        x, y = batch(state.dp_rank, step)
        loss = mr.forward_backward(model, x, y, loss_fn=nn.functional.mse_loss)
        optimizer.step()
        optimizer.zero_grad()
        committed = fault.current_step()
        if args.checkpoint_every and committed != saved and committed % args.checkpoint_every == 0:
            mr.save_checkpoint(None, model, optimizer, step=committed)
            saved = committed
        lines.write(json.dumps({"step": step, "loss": float(loss),
                                "committed_after": committed}) + "\n")
        lines.flush()
        time.sleep(args.delay)


if __name__ == "__main__":
    main()
