"""A SageMaker user's training script: 2 hosts x 1 process over gloo; rank 0 saves the model."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    loss = model(torch.ones(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f} rank {dist.get_rank()} of "
          f"{dist.get_world_size()}", flush=True)
if dist.get_rank() == 0:
    torch.save(model.state_dict(), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
dist.barrier()  # algo-2 ends after the model is saved (compose stops all at the first exit)
dist.destroy_process_group()
