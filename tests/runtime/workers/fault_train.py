"""A plain hybrid-sharded training script, run per replica group by
tests/runtime/test_fault_tolerance.py.

The training loop is a plain one: init(), transform(), a torch optimizer, forward_backward (or
loss.backward()), step, zero_grad; the launcher's MESHTRAIN_FT_* variables turn fault tolerance
on. Its one use of the fault API: each step's rows are chosen by the job's step number
(meshtrain_runtime.fault.step_to_run()), so a restarted group reads the rows of the step it joins
and the test can replay the job in one process. For the test's checks each rank also writes,
after every step, a digest of its local parameter shards and optimizer state keyed by the
committed step count (meshtrain_runtime.fault.current_step()), with its learning rate and its
scheduler's position: a LambdaLR kept in step with the committed steps by
``fault.track(scheduler)`` (the one line a script adds for that).

Arguments: OUT STEPS INIT_SEED DELAY STYLE [HOLD]: results folder, loop iterations, the seed of
the initial weights, seconds each step waits (data loading), "forward_backward" or "plain"
(``loss.backward()`` on the model's output: the runtime then sees no loss), and a file whose
presence keeps the loop going past STEPS (the test removes it to let the survivor finish).
TEST_PAUSE_AT=i: at loop iteration i the model's forward writes OUT/paused-g<g>-r<rank> and
sleeps, so that the test kills this group while its peers wait in the step's gradient average.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

import meshtrain_runtime as mr
from meshtrain_runtime import fault

FEATURES = 8
ROWS = 4  # per data-parallel rank and step
LR = 0.05


def lr_factor(step: int) -> float:
    """The schedule: step k trains at LR x lr_factor(k) (the test's replay uses it too)."""
    return 1.0 / (1.0 + 0.1 * step)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(FEATURES, FEATURES) for _ in range(2))
        self.head = nn.Linear(FEATURES, 1)
        self.pause: Path | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pause is not None:  # after this step's quorum, before its gradients
            self.pause.write_text("")
            time.sleep(60)
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def batch(dp_rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of data-parallel rank `dp_rank` at loop iteration `index` (the test replays them)."""
    generator = torch.Generator().manual_seed(1000 * index + dp_rank)
    return (torch.randn(ROWS, FEATURES, generator=generator),
            torch.randn(ROWS, 1, generator=generator))


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 of this rank's local parameter shards and optimizer state, in a fixed order."""
    sha = hashlib.sha256()
    for tensor in [p for _, p in sorted(model.named_parameters())]:
        sha.update(_bytes(tensor))
    for index, entry in sorted(optimizer.state_dict()["state"].items()):
        for name, value in sorted(entry.items()):
            sha.update(f"{index}.{name}".encode())
            sha.update(_bytes(value))
    return sha.hexdigest()


def _bytes(tensor: torch.Tensor) -> bytes:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def main() -> None:
    out, steps, init_seed, delay = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(
        sys.argv[4])
    plain = sys.argv[5] == "plain"
    hold = Path(sys.argv[6]) if len(sys.argv) > 6 else None
    state = mr.init({"hybrid_shard_degree": 2})
    group, rank = os.environ["MESHTRAIN_FT_REPLICA_GROUP"], state.rank
    launch = os.environ["TEST_LAUNCH"]
    (out / f"pid-g{group}-r{rank}-{launch}").write_text(str(os.getpid()))
    torch.manual_seed(init_seed)
    model = mr.transform(Tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = fault.track(torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor))
    loss_fn = nn.functional.mse_loss
    lines = (out / f"digest-g{group}-r{rank}-{launch}.jsonl").open("a")
    pause_at = int(os.environ.get("TEST_PAUSE_AT", "-1"))
    index = 0
    while index < steps or (hold is not None and hold.exists()):
        x, y = batch(state.dp_rank, fault.step_to_run())
        if index == pause_at:
            model.pause = out / f"paused-g{group}-r{rank}"
        if plain:
            loss = loss_fn(model(x), y)
            loss.backward()
        else:
            loss = mr.forward_backward(model, x, y, loss_fn=loss_fn)
        optimizer.step()
        scheduler.step()  # skipped after a step that did not commit (fault.track)
        optimizer.zero_grad()
        lines.write(json.dumps({"index": index, "step": fault.current_step(),
                                "dp_rank": state.dp_rank, "dp_size": state.dp_size,
                                "loss": float(loss), "digest": digest(model, optimizer),
                                "lr": optimizer.param_groups[0]["lr"],
                                "scheduler_epoch": scheduler.last_epoch}) + "\n")
        lines.flush()
        index += 1
        time.sleep(delay)


if __name__ == "__main__":
    main()
