"""Offload the inputs saved at checkpointed block boundaries to host memory.

Two implementations, chosen by SMP's ``sm_activation_offloading`` key:

* :class:`ActivationOffloader` (``sm_activation_offloading=True``, meshtrain's own): during
  forward each checkpointed block's saved inputs are copied to pinned host memory on a side CUDA
  stream (overlapping compute); during backward they are copied back at most
  ``activation_loading_horizon`` blocks ahead of use. The hooks keep the bookkeeping (which
  blocks are resident on the device) and count it, so tests can check the horizon on any host.
* :class:`NativeActivationOffloader` (``sm_activation_offloading=False``): torch's own
  ``torch.autograd.graph.save_on_cpu`` around the same tensors; loads happen on demand, there is
  no prefetch and no horizon.

Only tensors on a CUDA device are copied. On a CPU-only host the same hooks and bookkeeping run
and the tensors stay where they are (host memory is where they already live).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.distributed.tensor import DTensor

from meshtrain_runtime.torch_api import backward_is_running, queue_backward_callback

# (mesh, placements, shape, stride) of a DTensor whose local tensor was offloaded.
_DTensorSpec = tuple[Any, tuple[Any, ...], torch.Size, tuple[int, ...]]


@dataclass
class OffloadStats:
    """Counters of one offloader since it was built (or since :meth:`reset`)."""

    blocks_offloaded: int = 0
    tensors_offloaded: int = 0
    bytes_offloaded: int = 0
    """Bytes of the offloaded tensors (per rank; a DTensor counts its local shard)."""
    bytes_copied: int = 0
    """Bytes actually copied device -> host (0 on a CPU-only host)."""
    loads: int = 0
    prefetched_loads: int = 0
    """Loads issued ahead of use (at the end of forward, or for older blocks in backward)."""
    on_demand_loads: int = 0
    """Loads issued when a block's inputs were needed and not yet resident."""
    releases: int = 0
    """Resident blocks dropped by the window (a block whose backward is done is usually
    freed by autograd first: the trace records that as "free")."""
    max_resident_blocks: int = 0
    """Most blocks whose offloaded inputs were resident on the device at once."""
    trace: list[tuple[str, int]] | None = field(default=None, repr=False)
    """Set to ``[]`` to record events ("offload", "load", "use", "release", "free") with the
    block call's sequence number; replaying them gives the resident set at every moment."""

    def reset(self) -> None:
        """Zero every counter (keeps tracing on if it was on, with an empty trace)."""
        tracing = self.trace is not None
        for name, value in OffloadStats().__dict__.items():
            setattr(self, name, value)
        self.trace = [] if tracing else None

    def record(self, event: str, seq: int) -> None:
        if self.trace is not None:
            self.trace.append((event, seq))


class _Group:
    """The offloaded inputs of one checkpointed block call (one forward of one block)."""

    __slots__ = ("__weakref__", "device", "event", "host", "resident", "seq", "specs", "targets")

    def __init__(self) -> None:
        self.seq = -1  # assigned when the first tensor is packed
        self.host: list[torch.Tensor] = []
        self.specs: list[_DTensorSpec | None] = []
        self.targets: list[torch.device | None] = []  # None: stored as is, no copy
        self.device: list[torch.Tensor] | None = None
        self.event: torch.cuda.Event | None = None
        self.resident = False


def _split_dtensor(tensor: torch.Tensor) -> tuple[torch.Tensor, _DTensorSpec | None]:
    """Plain local tensor plus what rebuilds the DTensor (copies work on the local shard)."""
    if isinstance(tensor, DTensor):
        with torch.no_grad():
            local = tensor.to_local()
        return local, (tensor.device_mesh, tuple(tensor.placements), tensor.shape,
                       tensor.stride())
    return tensor, None


def _join_dtensor(local: torch.Tensor, spec: _DTensorSpec | None) -> torch.Tensor:
    if spec is None:
        return local
    mesh, placements, shape, stride = spec
    with torch.no_grad():
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape,
                                  stride=stride)


class ActivationOffloader:
    """meshtrain's offloader: side-stream copies and a bounded prefetch window.

    Use :meth:`block_hooks` around one checkpointed block call (the checkpoint's saved inputs
    are packed by it) and call :meth:`on_forward_end` when the model's forward returns, which
    starts loading the last blocks back, as SMP does. In backward, when block ``g``'s inputs are
    unpacked, the resident window becomes ``g`` and the ``loading_horizon - 1`` blocks offloaded
    just before it; everything else is released. So at most ``loading_horizon`` blocks' inputs
    are resident at once, and ``stats.max_resident_blocks`` shows how many were.
    """

    def __init__(self, loading_horizon: int = 2) -> None:
        if loading_horizon < 1:
            raise ValueError(f"loading_horizon must be >= 1, got {loading_horizon}")
        self.loading_horizon = loading_horizon
        self.stats = OffloadStats()
        self._groups: weakref.WeakValueDictionary[int, _Group] = weakref.WeakValueDictionary()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._end_of_backward_queued = False

    def __deepcopy__(self, memo: dict[int, Any]) -> ActivationOffloader:
        # A copied model gets its own offloader: streams, lock and pending blocks are per model.
        clone = ActivationOffloader(self.loading_horizon)
        memo[id(self)] = clone
        return clone

    def block_hooks(self) -> saved_tensors_hooks:
        """Hooks that offload what autograd saves while they are active (one block call)."""
        group = _Group()
        return saved_tensors_hooks(lambda tensor: self._pack(group, tensor), self._unpack)

    # --- forward -------------------------------------------------------------------------
    def _pack(self, group: _Group, tensor: torch.Tensor) -> tuple[_Group, int]:
        with self._lock:
            if group.seq < 0:
                group.seq = next(self._seq)
                self._groups[group.seq] = group
                # No lock here: the collector may run this while the lock is held.
                weakref.finalize(group, self.stats.record, "free", group.seq)
                self.stats.blocks_offloaded += 1
                self.stats.record("offload", group.seq)
            local, spec = _split_dtensor(tensor)
            if local.device.type == "cuda" and not local.is_sparse:
                group.host.append(self._copy_to_host(local))
                group.specs.append(spec)
                group.targets.append(local.device)
                self.stats.bytes_copied += local.nbytes
            else:  # nothing to gain: keep the tensor itself (also the DTensor wrapper)
                group.host.append(tensor)
                group.specs.append(None)
                group.targets.append(None)
            self.stats.tensors_offloaded += 1
            self.stats.bytes_offloaded += local.nbytes
            return group, len(group.host) - 1

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _copy_to_host(self, local: torch.Tensor) -> torch.Tensor:
        stream = self._side_stream(local.device)
        stream.wait_stream(torch.cuda.current_stream(local.device))  # the tensor is computed
        host = torch.empty(local.size(), dtype=local.dtype, layout=local.layout, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(local, non_blocking=True)
        # The device memory may be reused only after the side stream has read it.
        local.record_stream(stream)
        return host

    def on_forward_end(self) -> None:
        """Start loading the most recently offloaded blocks (the first ones backward needs)."""
        if not torch.is_grad_enabled():
            return
        with self._lock:
            alive = self._alive_groups()
            if alive:
                self._set_window(alive, alive[-1], on_demand=False)

    # --- backward ------------------------------------------------------------------------
    def _unpack(self, packed: tuple[_Group, int]) -> torch.Tensor:
        group, index = packed
        with self._lock:
            self._queue_end_of_backward()
            self._set_window(self._alive_groups(), group, on_demand=True)
            self.stats.record("use", group.seq)
            assert group.device is not None  # _set_window loaded it
            tensor = group.device[index]
            event = group.event
        if event is not None and group.targets[index] is not None:
            current = torch.cuda.current_stream(tensor.device)
            current.wait_event(event)
            tensor.record_stream(current)  # allocated on the side stream, used on this one
        return _join_dtensor(tensor, group.specs[index])

    def _alive_groups(self) -> list[_Group]:
        return sorted(list(self._groups.values()), key=lambda g: g.seq)

    def _set_window(self, alive: list[_Group], newest: _Group, *, on_demand: bool) -> None:
        """Make `newest` and the horizon-1 groups offloaded before it the resident set."""
        older = [g for g in alive if g.seq < newest.seq]
        older = older[max(0, len(older) - (self.loading_horizon - 1)):]
        window = [newest, *reversed(older)]
        keep = {g.seq for g in window}
        for group in alive:
            if group.resident and group.seq not in keep:
                self._release(group)
        for position, group in enumerate(window):
            if not group.resident:
                self._load(group, on_demand=on_demand and position == 0)
        resident = sum(g.resident for g in alive)
        self.stats.max_resident_blocks = max(self.stats.max_resident_blocks, resident)

    def _load(self, group: _Group, *, on_demand: bool) -> None:
        if any(target is not None for target in group.targets):
            device = next(t for t in group.targets if t is not None)
            stream = self._side_stream(device)
            with torch.cuda.stream(stream):
                group.device = [
                    host if target is None else host.to(target, non_blocking=True)
                    for host, target in zip(group.host, group.targets, strict=True)
                ]
                group.event = torch.cuda.Event()
                group.event.record(stream)
        else:
            group.device = list(group.host)
        group.resident = True
        self.stats.loads += 1
        if on_demand:
            self.stats.on_demand_loads += 1
        else:
            self.stats.prefetched_loads += 1
        self.stats.record("load", group.seq)

    def _release(self, group: _Group) -> None:
        group.device, group.event, group.resident = None, None, False
        self.stats.releases += 1
        self.stats.record("release", group.seq)

    def _queue_end_of_backward(self) -> None:
        if self._end_of_backward_queued or not backward_is_running():
            return
        self._end_of_backward_queued = True
        queue_backward_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        with self._lock:
            self._end_of_backward_queued = False
            for group in self._alive_groups():
                if group.resident:
                    self._release(group)

    def resident_blocks(self) -> int:
        """Blocks whose offloaded inputs are on the device now."""
        with self._lock:
            return sum(g.resident for g in self._alive_groups())


class NativeActivationOffloader:
    """torch's ``save_on_cpu`` around each checkpointed block's saved inputs (no horizon).

    Copies happen synchronously on the compute stream (pinned when CUDA is present), and each
    block's inputs come back when its backward needs them. DTensors are offloaded through their
    local shard.
    """

    def __init__(self) -> None:
        self.stats = OffloadStats()
        self._pin_memory = torch.cuda.is_available()

    def block_hooks(self) -> saved_tensors_hooks:
        """Hooks for one checkpointed block call."""
        native = torch.autograd.graph.save_on_cpu(pin_memory=self._pin_memory)
        first = [True]

        def pack(tensor: torch.Tensor) -> tuple[Any, _DTensorSpec | None]:
            local, spec = _split_dtensor(tensor)
            if first[0]:
                first[0] = False
                self.stats.blocks_offloaded += 1
            self.stats.tensors_offloaded += 1
            self.stats.bytes_offloaded += local.nbytes
            if local.device.type != "cpu":
                self.stats.bytes_copied += local.nbytes
            return native.pack_hook(local), spec

        def unpack(packed: tuple[Any, _DTensorSpec | None]) -> torch.Tensor:
            inner, spec = packed
            self.stats.loads += 1
            self.stats.on_demand_loads += 1
            return _join_dtensor(native.unpack_hook(inner), spec)

        return saved_tensors_hooks(pack, unpack)

    def on_forward_end(self) -> None:
        """Nothing to prefetch: torch's offload loads on demand."""


__all__ = ["ActivationOffloader", "NativeActivationOffloader", "OffloadStats"]
