"""Small helpers the workers share: whole and local views of DTensors, agreement across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a DTensor gathered; a plain tensor as is)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (a DTensor's local tensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def max_over_ranks(value: float) -> float:
    """The largest `value` any rank holds."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
