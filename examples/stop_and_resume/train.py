"""Train a tiny language model that saves on a stop, resumes from its latest checkpoint, and
survives a restart.

Runs on every rank under torchrun. At start the script loads the latest completed checkpoint in
``$SM_CHECKPOINT_DIR`` (the Estimator's ``checkpoint_local_path``, else the job's own folder that
every host shares), if there is one, and goes on from the step after it. After every step it asks
``meshtrain_runtime.stop_requested()`` — True on every rank at the same step once the job was
stopped (``job.stop()``, Ctrl-C in ``fit()``, ``max_run``, a reclaimed host) — and then saves that
step and exits. The data of step n is one global batch seeded by n, split over the
data-parallel ranks, so a stopped-and-resumed or restarted run trains on exactly the batches of
an uninterrupted one.

    --steps N            train steps 0 .. N-1 (fewer if stopped)
    --save-every K       also save after every K-th step (what a restart resumes from)
    --step-seconds S     sleep after each step (so that a stop lands mid-training)
    --fail-at-step F     on attempt 1 only (MESHTRAIN_ATTEMPT), the last rank SIGKILLs itself
                         after step F's loss, as a crashed process would
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

import meshtrain_runtime
from meshtrain_runtime.checkpoint import export_full_state_dict
from meshtrain_runtime.metrics import log_metric

VOCAB = 64


class Block(nn.Module):
    """A residual MLP block: the unit FSDP shards (transform finds the ModuleList)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    """Predicts the next token from the current one (the data is a repeating pattern)."""

    def __init__(self, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def global_batch(step: int, rows: int, seq_len: int) -> torch.Tensor:
    """Step `step`'s whole batch: the same whether the run was stopped, resumed or restarted."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    stride = torch.randint(1, 4, (rows, 1), generator=generator)
    return (start + stride * torch.arange(seq_len + 1)) % VOCAB


def resume(model: nn.Module, optimizer: torch.optim.Optimizer, state) -> int:
    """Load the latest completed checkpoint, if any; returns the first step to train."""
    latest = meshtrain_runtime.latest_checkpoint()  # None on a fresh start
    attempt = os.environ.get("MESHTRAIN_ATTEMPT", "1")
    if latest is None:
        if state.rank == 0:
            print(f"attempt {attempt}: fresh start", flush=True)
        return 0
    saved = meshtrain_runtime.load_checkpoint(latest, model, optimizer)["step"]
    if state.rank == 0:
        print(f"attempt {attempt}: resumed from step {saved} ({latest})", flush=True)
    return saved + 1


def die_once(step: int, fail_at: int, state) -> None:
    """The last rank SIGKILLs itself after step `fail_at`, on the job's first attempt only."""
    first_attempt = os.environ.get("MESHTRAIN_ATTEMPT", "1") == "1"
    if step == fail_at and first_attempt and state.rank == state.world_size - 1:
        print(f"rank {state.rank}: simulating a crash after step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters
    return args


def main() -> None:
    args = parse_args()
    state = meshtrain_runtime.init()
    torch.manual_seed(0)
    model = meshtrain_runtime.transform(TinyLM())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after transform
    start = resume(model, optimizer, state)
    per_rank = args.global_batch // state.dp_size
    steps, losses, stopped_at = [], [], None
    for step in range(start, args.steps):
        tokens = global_batch(step, args.global_batch, args.seq_len)
        tokens = tokens[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps.append(step)
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        log_metric("train:loss", losses[-1], step=step)
        die_once(step, args.fail_at_step, state)
        stopping = meshtrain_runtime.stop_requested()  # a collective: the same on every rank
        if stopping or (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            meshtrain_runtime.save_checkpoint(None, model, optimizer, step=step)
        if stopping:
            stopped_at = step
            if state.rank == 0:
                print(f"stop requested: saved step {step}, exiting", flush=True)
            break
        time.sleep(args.step_seconds)

    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))
    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({
            "steps": steps, "train:loss": losses, "resumed_from": start - 1 if start else None,
            "stopped_at": stopped_at}))
        if losses:
            print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
