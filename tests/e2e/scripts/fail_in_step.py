"""Four ranks all-reduce; rank 2 raises a ValueError inside a helper while the other three wait
in the next all-reduce, so each of them fails too ("Connection closed by peer")."""

import torch
import torch.distributed as dist


def check_learning_rate(lr: float) -> None:
    if lr <= 0:
        raise ValueError(f"learning rate must be positive, got {lr}")


dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(1)
dist.all_reduce(value)
print(f"rank {rank} started", flush=True)
check_learning_rate(-0.1 if rank == 2 else 0.1)
dist.all_reduce(value)
