"""A plain hybrid-sharded script fed by ``meshtrain_runtime.data.loader``, run by
tests/e2e/test_data_fault_tolerance.py as an Estimator job with ``fault_tolerance:
{"replica_groups": 2}``. Its loop is ``for inputs, targets in loader:`` and nothing in it knows
about fault tolerance: the loader hands out the rows of the job's step (a restarted group heals
and starts at the job's step; a step that did not commit is read again) and ends every group's
loop at the run's last step.

For the test's checks each rank writes, into its host's output data dir,
``ft-rows-dp<dp_rank>.jsonl`` (one line per batch it was handed: the loader's step, the samples,
its loss and the time) and, at the end, ``ft-end-dp<dp_rank>.json`` (the loader's step when its loop
ended). Each step waits --delay seconds (its data loading); --num-workers DataLoader workers
prepare the batches ahead.
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

INIT_SEED, LR = 0, 0.01


class NextByte(nn.Module):
    """Embedding -> MLP -> logits over the loader's byte ids."""

    def __init__(self, vocab: int, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--num-workers", type=int, default=0)
    args, _ = parser.parse_known_args()
    state = mr.init()
    loader = mr.data.loader("train", global_batch_size=args.global_batch_size,
                            seq_len=args.seq_len, steps=args.steps, num_workers=args.num_workers)
    torch.manual_seed(INIT_SEED)
    model = mr.transform(NextByte(loader.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    rows = (out / f"ft-rows-dp{state.dp_rank}.jsonl").open("a")
    for inputs, targets in loader:
        loss = mr.forward_backward(model, inputs, targets, loss_fn=loss_fn)
        optimizer.step()
        optimizer.zero_grad()
        samples = torch.cat([inputs, targets[:, -1:]], dim=1).tolist()
        rows.write(json.dumps({"step": loader.step - 1, "samples": samples,
                               "loss": float(loss), "time": time.time()}) + "\n")
        rows.flush()
        time.sleep(args.delay)
    (out / f"ft-end-dp{state.dp_rank}.json").write_text(json.dumps({"end": loader.step}))


if __name__ == "__main__":
    main()
