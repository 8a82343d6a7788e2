"""Two ranks train; in its third step rank 1 sleeps between backward and the gradient
all-reduce, so rank 0 waits for it inside that collective."""

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
    if rank == 1 and step == 2:
        time.sleep(int(os.environ.get("SLEEP_SECONDS", "600")))  # the hang, inside the step
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    print(f"rank {rank} step {step}", flush=True)
