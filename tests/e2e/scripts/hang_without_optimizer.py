"""Two ranks train with a hand-written SGD update (no torch.optim) after an all-reduce of the
gradients. HANG_AT=step3: in its third step rank 1 sleeps between backward and the all-reduce,
so rank 0 waits for it inside that collective. HANG_AT=startup: rank 1 sleeps before its first
step, so rank 0 waits in the first all-reduce."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
hang_at = os.environ.get("HANG_AT", "step3")
if rank == 1 and hang_at == "startup":
    time.sleep(600)  # the hang, before the first step
model = torch.nn.Linear(4, 1)
for step in range(1, 6):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()
    if rank == 1 and hang_at == "step3" and step == 3:
        time.sleep(600)  # the hang, inside the step
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        with torch.no_grad():
            parameter -= 0.1 * parameter.grad
        parameter.grad = None
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(0.5)  # a step that takes time: progress is what the loop completes, not a clock
