"""The collectives context parallelism needs, on any backend (gloo included).

Key and value travel as one flat buffer (one message per hop instead of two). Everything here
uses the cp group's own rank numbering (group_peer / group ranks), never global ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

KV_TAG, GRAD_TAG = 0, 1  # ring messages of keys/values and of their gradients


def pack(*tensors: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The tensors flattened into one contiguous buffer (in `dtype` when given)."""
    return torch.cat([t.reshape(-1).to(dtype or t.dtype) for t in tensors])


def unpack(buffer: torch.Tensor, *like: torch.Tensor) -> list[torch.Tensor]:
    """Views of `buffer` shaped as each of `like` (the inverse of `pack`)."""
    out, offset = [], 0
    for t in like:
        out.append(buffer[offset:offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out


class RingExchange:
    """Send a buffer to the next cp rank while receiving one from the previous (async)."""

    def __init__(self, buffer: torch.Tensor, group: dist.ProcessGroup, tag: int) -> None:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        self.received = torch.empty_like(buffer)
        ops = [
            dist.P2POp(dist.isend, buffer.contiguous(), group=group,
                       group_peer=(rank + 1) % size, tag=tag),
            dist.P2POp(dist.irecv, self.received, group=group,
                       group_peer=(rank - 1) % size, tag=tag),
        ]
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        """The buffer the previous rank sent."""
        for work in self._works:
            work.wait()
        return self.received


def all_gather_rows(buffer: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(cp, n): row j is cp rank j's flat `buffer` of n elements."""
    size = dist.get_world_size(group)
    out = torch.empty(size, buffer.numel(), dtype=buffer.dtype, device=buffer.device)
    dist.all_gather(list(out.unbind(0)), buffer.contiguous(), group=group)
    return out


def reduce_scatter_rows(rows: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Sum over ranks of row `rank` of each rank's (cp, n) `rows` (a reduce-scatter, built on
    all_to_all_single, which gloo has for every dtype)."""
    received = torch.empty_like(rows)
    dist.all_to_all_single(received, rows.contiguous(), group=group)
    return received.sum(dim=0)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over equal splits of dim 0; its gradient is the same exchange back."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, tensor.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_to_all(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Differentiable all-to-all: slice j of dim 0 goes to cp rank j; slice i of the result
    came from cp rank i."""
    return _AllToAll.apply(tensor, group)
