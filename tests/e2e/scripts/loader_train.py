"""A sharded next-byte model fed by ``meshtrain_runtime.data.loader`` from the ``train`` channel,
saving checkpoints with the loader. It has no seeding or skipping code for its data: a restarted
or resumed job continues where the checkpoint left the loader, on whatever layout it runs.

    --steps N             the run's global batches (the loader's steps)
    --checkpoint-every K  save (model, optimizer, loader) after every K batches
    --kill-step S         on attempt 1 only, the last rank SIGKILLs itself once it holds batch
                          S's rows (before its forward), so the restart resumes from the last
                          checkpoint before S

Rank 0 prints "resumed at batch <n> (attempt <a>)" and "step <n> loss <repr>"; every rank
appends the samples it was handed to ``$SM_OUTPUT_DATA_DIR/rows-dp<dp_rank>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from torch import nn

import meshtrain_runtime as mr


class NextByte(nn.Module):
    """Embedding -> MLP -> logits: a tiny language model over the loader's byte ids."""

    def __init__(self, vocab: int, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh())
        self.head = nn.Linear(2 * width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(self.embed(tokens)))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--checkpoint-every", type=int, default=4)
    parser.add_argument("--kill-step", type=int, default=-1)
    args, _ = parser.parse_known_args()
    state = mr.init()
    attempt = int(os.environ.get("MESHTRAIN_ATTEMPT", "1"))
    loader = mr.data.loader("train", global_batch_size=args.global_batch_size,
                            seq_len=args.seq_len, steps=args.steps)
    torch.manual_seed(0)  # the initial weights (a resume overwrites them)
    model = mr.transform(NextByte(loader.vocab_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    latest = mr.latest_checkpoint()
    if latest is not None:
        mr.load_checkpoint(latest, model, optimizer, loader=loader)
        if state.rank == 0:
            print(f"resumed at batch {loader.step} (attempt {attempt})", flush=True)
    rows = (Path(os.environ["SM_OUTPUT_DATA_DIR"]) / f"rows-dp{state.dp_rank}.jsonl").open("a")
    for inputs, targets in loader:
        step = loader.step - 1
        if step == args.kill_step and attempt == 1 and state.rank == state.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = mr.global_mean(mr.forward_backward(model, inputs, targets, loss_fn=loss_fn))
        optimizer.step()
        optimizer.zero_grad()
        samples = torch.cat([inputs, targets[:, -1:]], dim=1).tolist()
        rows.write(json.dumps({"step": step, "dp_size": state.dp_size, "samples": samples}) + "\n")
        rows.flush()
        if state.rank == 0:
            print(f"step {step} loss {loss!r}", flush=True)
        if loader.step % args.checkpoint_every == 0:
            mr.save_checkpoint(None, model, optimizer, step=loader.step, loader=loader)


if __name__ == "__main__":
    main()
