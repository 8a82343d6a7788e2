"""Measure the memory a training step needs: saved activations and, on CUDA, peak allocation.

Saved activations are counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor
autograd keeps for backward passes through the meter's pack hook, which records its storage
once. Parameters (leaf tensors that require grad, and views of them) are not activations and are
left out. Tensors that activation checkpointing discards inside a block never reach the meter
(the checkpoint's own hooks take them), so the count is what the graph really holds. A DTensor
counts its local shard: the numbers are per rank. The planner's calibration and scripts use the
same helpers; they work on CPU and CUDA alike (peak allocation needs CUDA).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from meshtrain_runtime.torch_api import (
    AsyncCollectiveTensor,
    collective_value,
    dtensor_local,
    view_base,
)


@dataclass(frozen=True)
class SavedActivations:
    """What autograd saved for backward while a :class:`SavedActivationMeter` was active."""

    bytes: int
    """Bytes of the distinct storages saved (a storage saved twice counts once)."""
    num_tensors: int
    """Saved tensors (activations only; each save counts)."""
    num_storages: int


@dataclass(frozen=True)
class StepMemory:
    """Memory of one step (forward and backward) as :func:`measure_step_memory` saw it."""

    saved_activation_bytes: int
    peak_allocated_bytes: int | None
    """``torch.cuda.max_memory_allocated`` during the step; None without CUDA."""
    peak_above_start_bytes: int | None
    """Peak minus what was allocated when the step began (activations, gradients, buffers)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return dtensor_local(tensor)


def _is_parameter_like(tensor: torch.Tensor) -> bool:
    base = view_base(tensor)
    return base.is_leaf and base.requires_grad


class SavedActivationMeter:
    """Context manager that counts the activations autograd saves while it is active.

    Example::

        with SavedActivationMeter() as meter:
            loss = model(input_ids, labels=labels).loss
        print(meter.result.bytes)
        loss.backward()
    """

    def __init__(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        """`parameters`: tensors whose storages are never activations, even when seen through
        a non-leaf view (tensor parallelism runs replicated weights through ``to_local()``)."""
        self._seen: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._bytes = 0
        self._tensors = 0
        self._parameter_storages = {
            _local(p).untyped_storage().data_ptr() for p in parameters
            if _local(p).device.type != "meta"
        }
        self._hooks = saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if _is_parameter_like(tensor):
            return tensor
        local = _local(tensor)
        if isinstance(local, AsyncCollectiveTensor):  # a functional collective's result
            local = collective_value(local)
        if local.device.type != "meta" and (
                local.untyped_storage().data_ptr() in self._parameter_storages):
            return tensor
        self._tensors += 1
        if local.device.type == "meta":
            self._bytes += local.nbytes
            return tensor
        storage = local.untyped_storage()
        key = storage.data_ptr()
        known = self._seen.get(key)
        # A storage freed and another allocated at the same address is a new one.
        if known is None or known() is None:
            self._seen[key] = weakref.ref(storage)
            self._bytes += storage.nbytes()
        return tensor

    @property
    def result(self) -> SavedActivations:
        """Counts so far (usable inside and after the ``with`` block)."""
        return SavedActivations(self._bytes, self._tensors, len(self._seen))

    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._hooks.__exit__(exc_type, exc, traceback)


def measure_saved_activations(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> SavedActivations:
    """Run ``fn(*args, **kwargs)`` (usually a forward) and count what autograd saved."""
    with SavedActivationMeter() as meter:
        fn(*args, **kwargs)
    return meter.result


def measure_saved_activation_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Bytes of activations saved for backward while ``fn(*args, **kwargs)`` runs."""
    return measure_saved_activations(fn, *args, **kwargs).bytes


def measure_step_memory(
    step: Callable[[], Any], *, device: torch.device | str | None = None
) -> StepMemory:
    """Run one step (forward and backward) and report saved activations and peak memory.

    `device` is the CUDA device to read peak allocation from; by default the current CUDA device
    when CUDA is initialised, else none (peak fields are None, e.g. on a CPU-only host).
    """
    cuda = _cuda_device(device)
    start = None
    if cuda is not None:
        torch.cuda.synchronize(cuda)
        torch.cuda.reset_peak_memory_stats(cuda)
        start = torch.cuda.memory_allocated(cuda)
    with SavedActivationMeter() as meter:
        step()
    if cuda is None:
        return StepMemory(meter.result.bytes, None, None)
    torch.cuda.synchronize(cuda)
    peak = torch.cuda.max_memory_allocated(cuda)
    return StepMemory(meter.result.bytes, peak, peak - (start or 0))


def _cuda_device(device: torch.device | str | None) -> torch.device | None:
    if device is not None:
        device = torch.device(device)
        return device if device.type == "cuda" else None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


_MARK_BYTES = 1_000_003
"""Odd sizes of the marker allocations that split the profiler's memory events into phases
(no tensor of the step has this many bytes plus a small index)."""


class PhaseMemoryMeter:
    """Peak bytes allocated above the start, phase by phase, while the meter is active.

    Call :meth:`mark` at the end of each phase (e.g. "forward" from a hook on the output
    head, "loss", "backward", "optimizer_step"); :attr:`peaks` maps each phase to the most
    bytes that were allocated at once, counted from the ``with`` block's start (what existed
    before, such as the sharded parameters and optimizer states, is the baseline 0).

    On CUDA this is ``torch.cuda.max_memory_allocated`` reset at every mark. On CPU it is the
    running sum of the memory events of ``torch.profiler.profile(profile_memory=True)``: each
    mark allocates and frees a marker of an unusual size that splits the events into phases.
    Memory freed during the block but allocated before it is not subtracted on CPU (the
    profiler does not know its size), so free what the step would free before entering.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._cuda = _cuda_device(device)
        self._names: list[str] = []
        self._cuda_peaks: dict[str, int] = {}
        self._start = 0
        self._profiler: Any = None
        self.peaks: dict[str, int] = {}

    def __enter__(self) -> PhaseMemoryMeter:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
            torch.cuda.reset_peak_memory_stats(self._cuda)
            self._start = torch.cuda.memory_allocated(self._cuda)
            return self
        from torch.profiler import ProfilerActivity, profile  # only when measuring on CPU

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()
        return self

    def mark(self, name: str) -> None:
        """End the current phase and name it `name`."""
        if self._cuda is not None:
            self._cuda_peaks[name] = torch.cuda.max_memory_allocated(self._cuda) - self._start
            torch.cuda.reset_peak_memory_stats(self._cuda)
        else:
            marker = torch.empty(_MARK_BYTES + len(self._names), dtype=torch.uint8)
            del marker
        self._names.append(name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._cuda is not None:
            self.peaks = dict(self._cuda_peaks)
            return
        self._profiler.__exit__(exc_type, exc, traceback)
        if exc_type is None:
            self.peaks = self._cpu_peaks(self._profiler.profiler.kineto_results.events())

    def _cpu_peaks(self, events: Iterable[Any]) -> dict[str, int]:
        memory = sorted((e for e in events if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        markers = {_MARK_BYTES + i: name for i, name in enumerate(self._names)}
        peaks: dict[str, int] = {}
        live = peak = 0
        for event in memory:
            nbytes = event.nbytes()
            if nbytes in markers:  # a phase ends here (its free, -nbytes, is skipped too)
                peaks[markers[nbytes]] = peak
                peak = live
                continue
            if -nbytes in markers:
                continue
            live += nbytes
            peak = max(peak, live)
        return peaks


__all__ = [
    "PhaseMemoryMeter",
    "SavedActivationMeter",
    "SavedActivations",
    "StepMemory",
    "measure_saved_activation_bytes",
    "measure_saved_activations",
    "measure_step_memory",
]
