"""Count the collectives of a step and their payload bytes, with torch's CommDebugMode.

A diagnostic for tests, the planner's calibration and benchmarks; never imported on the training
path: torch's debug mode pulls in numpy, which a training job does not otherwise need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.distributed.tensor.debug import CommDebugMode

_OP_NAMES = {
    "all_reduce": "all_reduce", "allreduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather",
    "allgather_": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "broadcast_": "broadcast",
}


@dataclass
class CollectiveStats:
    """Collectives of one measured step: counts and payload bytes per (phase, op).

    Payload is the size of the whole logical tensor (an all-gather's output, a
    reduce-scatter's input), the unit Megatron's formulas use.
    """

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    payload_bytes: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, phase: str, op: str, nbytes: int) -> None:
        self.counts[(phase, op)] = self.counts.get((phase, op), 0) + 1
        self.payload_bytes[(phase, op)] = self.payload_bytes.get((phase, op), 0) + nbytes


class _ByteCountingCommMode(CommDebugMode):
    """torch's CommDebugMode, also recording each collective's payload bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.stats = CollectiveStats()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and self.get_total_counts() > before:
            phase = "backward" if self.advanced_module_tracker.is_bw else "forward"
            name = func.overloadpacket.__name__
            self.stats.add(phase, _OP_NAMES.get(name, name), _payload_bytes(name, args))
        return out


def _payload_bytes(name: str, args: tuple) -> int:
    tensors = args[0] if isinstance(args[0], list | tuple) else [args[0]]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    if name == "all_gather_into_tensor":
        return nbytes * int(args[1])  # args: input, group_size, group
    if name == "_allgather_base_":
        return args[0].numel() * args[0].element_size()  # args: output, input
    if name == "_reduce_scatter_base_":
        return args[1].numel() * args[1].element_size()  # args: output, input
    return nbytes


def count_collectives(step: Callable[[], Any]) -> CollectiveStats:
    """Run `step` (forward + backward) under torch's CommDebugMode; return its collectives."""
    mode = _ByteCountingCommMode()
    with mode:
        step()
    return mode.stats


__all__ = ["CollectiveStats", "count_collectives"]
