"""What counts as progress for the hang watchdog, hooked in without importing torch first.

A training loop makes progress when it completes a collective of torch.distributed's Python API
(hand-written all-reduces, FSDP2's all-gathers and reduce-scatters, barriers), a backward pass
(``loss.backward()``, ``torch.autograd.grad``) or an optimizer step. None of these needs
torch.optim, so a loop with a hand-written update is covered too.

The rank wrapper starts before the script imports torch (a script may set environment variables
that torch reads at import), so the hooks go in when torch's own modules finish executing: a
``sys.meta_path`` finder wraps the loader of ``torch.distributed.distributed_c10d`` and
``torch.autograd`` and, right after each module has run, wraps the functions above with a
timestamp on return. ``torch.distributed``'s ``from .distributed_c10d import *`` then picks the
wrapped functions up. Functional collectives (DTensor's) are not wrapped; the backward pass and
the optimizer step around them are.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_single", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "gather", "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "scatter", "send",
)
WRAPPED = {
    "torch.distributed.distributed_c10d": COLLECTIVES,
    "torch.autograd": ("backward", "grad"),
}


def _timestamped(function: Callable[..., Any], progress: Callable[[], None]) -> Callable:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        progress()  # on return: a collective that never completes is no progress
        return result

    call.__meshtrain_progress__ = True  # type: ignore[attr-defined]
    return call


def wrap_module(module: ModuleType, names: Sequence[str], progress: Callable[[], None]) -> None:
    """Replace each function `names` of `module` by one that calls `progress` on return."""
    for name in names:
        function = getattr(module, name, None)
        if callable(function) and not getattr(function, "__meshtrain_progress__", False):
            setattr(module, name, _timestamped(function, progress))


def _wrap_after_import(
    module: ModuleType, *, names: Sequence[str], progress: Callable[[], None]
) -> None:
    wrap_module(module, names, progress)


class _ThenWrap(importlib.abc.Loader):
    """A loader that runs the real one, then wraps the module's progress functions."""

    def __init__(self, loader: importlib.abc.Loader, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _ProgressFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then wraps the loader of WRAPPED modules."""

    def __init__(self, progress: Callable[[], None]) -> None:
        self.progress = progress

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in WRAPPED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                after = functools.partial(
                    _wrap_after_import, names=WRAPPED[fullname], progress=self.progress
                )
                spec.loader = _ThenWrap(spec.loader, after)
                return spec
        return None


def install(progress: Callable[[], None]) -> None:
    """Count completed collectives and backward passes as progress (see the module doc);
    modules already imported are wrapped now."""
    for name, names in WRAPPED.items():
        if name in sys.modules:
            wrap_module(sys.modules[name], names, progress)
    if "torch.distributed" in sys.modules:  # its star-import already bound the originals
        wrap_module(sys.modules["torch.distributed"], COLLECTIVES, progress)
    if not any(isinstance(finder, _ProgressFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ProgressFinder(progress))
