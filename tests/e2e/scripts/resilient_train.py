"""A small fully-sharded (FSDP2) MLP that checkpoints every step, resumes, and stops cleanly.

Every rank holds its own shard, so each checkpoint has one DCP file per rank. Each step uses a
fixed global batch (seeded by the step) split over the ranks, so the loss of step n is the same
whether the job ran straight through, was restarted or was resumed by another job.

    --steps N           train steps 0 .. N-1 (fewer if stopped)
    --step-seconds S    sleep after each step (gives a test time to stop the job)
    --kill-step K       on attempt 1 only, the last rank SIGKILLs itself after step K's loss
                        (before its save), so the restart resumes from step K-1's checkpoint

Rank 0 prints "resumed from step <n>", "step <n> loss <repr>", "stop requested after step <n>".
"""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import meshtrain_runtime as mr

ROWS = 8
WIDTH = 16

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--step-seconds", type=float, default=0.0)
parser.add_argument("--kill-step", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ.get("MESHTRAIN_ATTEMPT", "1"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, 32), nn.Tanh(), nn.Linear(32, 1))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

start = 0
latest = mr.latest_checkpoint()
if latest is not None:
    start = mr.load_checkpoint(latest, model, optimizer)["step"] + 1
    if rank == 0:
        print(f"resumed from step {start - 1} (attempt {attempt})", flush=True)

for step in range(start, args.steps):
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(ROWS, WIDTH, generator=generator)
    y = x.sum(dim=1, keepdim=True).sin()
    rows = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    loss = ((model(x[rows]) - y[rows]) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    if rank == 0:
        print(f"step {step} loss {(total / world).item()!r}", flush=True)
    if step == args.kill_step and attempt == 1 and rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    stopping = mr.stop_requested()  # the same answer on every rank
    mr.save_checkpoint(None, model, optimizer, step=step, keep_last=2)
    if stopping:
        if rank == 0:
            print(f"stop requested after step {step}", flush=True)
        break
    time.sleep(args.step_seconds)
