"""A plain hybrid-sharded training script, with nothing in it about fault tolerance.

Runs on every rank under torchrun: ``init()``, ``transform()``, a torch optimizer and a loop of
its own counter (``forward_backward``, ``step``, ``zero_grad``). With
``torch_distributed.fault_tolerance`` in the job's distribution each replica group runs this
script as a world of its own; when one group fails, the others train on, the failed group is
restarted, heals from a live peer at the job's step and joins again; when a group's loop ends,
the job ends (a restarted group, whose loop began again from 0, stops instead of training on
alone). Rows come from the job-wide data-parallel rank (``state.dp_rank``), fixed through
failures.

    --steps N          loop iterations (the job's steps when nothing fails)
    --step-seconds S   seconds each step waits for its "data"
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import meshtrain_runtime as mr
from meshtrain_runtime.metrics import log_metric

FEATURES, ROWS = 16, 8  # rows per data-parallel rank and step


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(2))
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def batch(dp_rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * index + dp_rank)
    x = torch.randn(ROWS, FEATURES, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    args, _ = parser.parse_known_args()
    state = mr.init()
    torch.manual_seed(0)
    model = mr.transform(Tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for index in range(args.steps):
        x, y = batch(state.dp_rank, index)
        loss = mr.forward_backward(model, x, y, loss_fn=nn.functional.mse_loss)
        optimizer.step()
        optimizer.zero_grad()
        if index % 20 == 0:
            log_metric("train:loss", float(loss), step=index)
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()
