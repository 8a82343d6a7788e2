"""Two ranks train; after its second optimizer step rank 1 sleeps instead of going on, so
rank 0 waits for it in the next collective."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    print(f"rank {rank} step {step}", flush=True)
    if rank == 1 and step == 1:
        time.sleep(int(os.environ.get("SLEEP_SECONDS", "600")))  # the hang
