"""A plain hybrid-sharded training script, run by tests/e2e/test_fault_tolerance_job.py as an
Estimator job with ``fault_tolerance: {"replica_groups": 2}``: nothing in it knows about fault
tolerance (init(), transform(), a torch optimizer, forward_backward, step, zero_grad) and it
saves no checkpoint.

For the test's checks each rank writes, into its host's output data dir:

- ``ft-steps-dp<dp_rank>.jsonl``, one line per loop iteration: the loop index (which rows it
  trained on), the step it ran as (``fault.current_step()`` after the forward, which heals a
  restarted group), its loss, the committed steps after it and a sha256 of its local parameter
  shards and optimizer state then;
- ``ft-digest-dp<dp_rank>.json`` at the end: the step count and that sha256.

Its loop runs --max-steps iterations by its own counter (a restarted group runs it from the
top: the backend and the runtime end the job when a group finishes, docs/fault-tolerance.md),
or stops once the step count reaches the number in ``$FT_TEST_DIR/stop-at`` when the test
writes one; each step waits --delay seconds (its data loading).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

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


def batch(dp_rank: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of data-parallel rank `dp_rank` at loop iteration `index` (the test replays them)."""
    generator = torch.Generator().manual_seed(1000 * index + dp_rank)
    return (torch.randn(ROWS, FEATURES, generator=generator),
            torch.randn(ROWS, 1, generator=generator))


def digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 of this rank's local parameter shards and optimizer state, in a fixed order."""
    sha = hashlib.sha256()
    for _, tensor in sorted(model.named_parameters()):
        sha.update(_bytes(tensor))
    for index, entry in sorted(optimizer.state_dict()["state"].items()):
        for name, value in sorted(entry.items()):
            sha.update(f"{index}.{name}".encode())
            sha.update(_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    return sha.hexdigest()


def _bytes(tensor: torch.Tensor) -> bytes:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def stop_at() -> int | None:
    path = Path(os.environ["FT_TEST_DIR"]) / "stop-at"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=0.2)  # seconds of "data loading" a step
    args, _ = parser.parse_known_args()
    state = mr.init()
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    torch.manual_seed(INIT_SEED)
    model = mr.transform(Tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    lines = (out / f"ft-steps-dp{state.dp_rank}.jsonl").open("a")
    for index in range(args.max_steps):
        last = stop_at()
        if last is not None and fault.current_step() >= last:
            break
        x, y = batch(state.dp_rank, index)
        loss = mr.forward_backward(model, x, y, loss_fn=nn.functional.mse_loss)
        step = fault.current_step()  # after the forward: a healing group has its peer's count
        optimizer.step()
        optimizer.zero_grad()
        lines.write(json.dumps({"index": index, "step": step, "loss": float(loss),
                                "committed_after": fault.current_step(),
                                "digest": digest(model, optimizer)}) + "\n")
        lines.flush()
        time.sleep(args.delay)
    (out / f"ft-digest-dp{state.dp_rank}.json").write_text(json.dumps(
        {"step": fault.current_step(), "digest": digest(model, optimizer)}))


if __name__ == "__main__":
    main()
