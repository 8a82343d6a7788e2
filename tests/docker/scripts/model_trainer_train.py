"""A ModelTrainer user's script: a tiny model trained with the SMP layout the job sets
(`meshtrain_runtime.init()` reads it, whoever started torchrun); rank 0 writes the losses and
what it was started with to the model folder, which becomes model.tar.gz."""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import meshtrain_runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.05)
args, _ = parser.parse_known_args()  # SDK v3 also passes --mp_parameters '{...}'

state = meshtrain_runtime.init()
torch.manual_seed(0)
model = meshtrain_runtime.transform(torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
inputs = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
targets = inputs.sum(dim=1, keepdim=True)
rows = inputs.shape[0] // state.world_size
mine = slice(state.rank * rows, (state.rank + 1) * rows)
losses = []
for _ in range(args.steps):
    loss = torch.nn.functional.mse_loss(model(inputs[mine]), targets[mine])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    losses.append(total.item() / state.world_size)
if state.rank == 0:
    report = {"losses": losses, "world_size": state.world_size,
              "hybrid_shard_degree": state.hybrid_shard_degree, "argv": sys.argv[1:]}
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "report.json"), "w") as handle:
        json.dump(report, handle)
print(f"rank {state.rank} of {state.world_size}: losses {losses}", flush=True)
dist.barrier()  # every host ends after the report is written (compose stops all at one's exit)
