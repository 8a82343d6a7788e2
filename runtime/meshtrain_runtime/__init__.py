"""meshtrain_runtime: the in-host runtime (bootstrap, state, transform) built on torch.

Public API (loaded on first use, so ``import meshtrain_runtime`` does not import torch; the
bootstrap and the rank entry wrapper import this package before any torch is needed):

- ``init(config=None)``, ``state``, ``is_initialized()``, ``reset()`` — meshtrain_runtime.state
- ``transform(model, ...)`` — meshtrain_runtime.parallelize (named apart from the function,
  so importing the module never rebinds the package attribute ``transform``)
- ``clip_grad_norm_(model, max_norm)``, ``grad_scaler()`` — meshtrain_runtime.grad
- ``data.loader(source, global_batch_size=...)`` — meshtrain_runtime.data (global batches, one
  cursor for every layout; ``shard_dataset`` / ``build_sampler``: per-rank helpers)
- ``save_checkpoint``, ``load_checkpoint``, ``latest_checkpoint`` — meshtrain_runtime.checkpoint
  (a package: sharded save/load, RNG states, export)
- ``stop_requested()`` — meshtrain_runtime.stopping (a stop every rank agrees on)
- ``global_mean(loss)`` — meshtrain_runtime.metrics (a loss averaged over every rank)
- ``forward_backward(model, inputs, targets, loss_fn=fn)`` — meshtrain_runtime.step (one
  step's forward and backward for every layout, pipelined or not)
- ``context_parallel_shard(*tensors, seq_dim=1)`` (cp_rank, cp_size: this process's by default) —
  meshtrain_runtime.parallel.context (a batch split into a context-parallel rank's chunks)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshtrain_runtime import data, state
    from meshtrain_runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from meshtrain_runtime.data import build_sampler, shard_dataset
    from meshtrain_runtime.grad import clip_grad_norm_, grad_scaler
    from meshtrain_runtime.metrics import global_mean
    from meshtrain_runtime.parallel.context import context_parallel_shard
    from meshtrain_runtime.parallelize import transform
    from meshtrain_runtime.state import init, is_initialized, reset
    from meshtrain_runtime.step import forward_backward
    from meshtrain_runtime.stopping import stop_requested

# public name -> (module, attribute); attribute None means the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "init": ("meshtrain_runtime.state", "init"),
    "is_initialized": ("meshtrain_runtime.state", "is_initialized"),
    "reset": ("meshtrain_runtime.state", "reset"),
    # `state` is the state module: its __getattr__ reads the current RuntimeState, so the
    # package attribute stays right even after `import meshtrain_runtime.state` rebinds it.
    "state": ("meshtrain_runtime.state", None),
    "data": ("meshtrain_runtime.data", None),
    "transform": ("meshtrain_runtime.parallelize", "transform"),
    "clip_grad_norm_": ("meshtrain_runtime.grad", "clip_grad_norm_"),
    "grad_scaler": ("meshtrain_runtime.grad", "grad_scaler"),
    "shard_dataset": ("meshtrain_runtime.data", "shard_dataset"),
    "build_sampler": ("meshtrain_runtime.data", "build_sampler"),
    "save_checkpoint": ("meshtrain_runtime.checkpoint", "save_checkpoint"),
    "load_checkpoint": ("meshtrain_runtime.checkpoint", "load_checkpoint"),
    "latest_checkpoint": ("meshtrain_runtime.checkpoint", "latest_checkpoint"),
    "stop_requested": ("meshtrain_runtime.stopping", "stop_requested"),
    "global_mean": ("meshtrain_runtime.metrics", "global_mean"),
    "forward_backward": ("meshtrain_runtime.step", "forward_backward"),
    "context_parallel_shard": ("meshtrain_runtime.parallel.context", "context_parallel_shard"),
}

__all__ = [
    "build_sampler",
    "clip_grad_norm_",
    "context_parallel_shard",
    "data",
    "forward_backward",
    "global_mean",
    "grad_scaler",
    "init",
    "is_initialized",
    "latest_checkpoint",
    "load_checkpoint",
    "reset",
    "save_checkpoint",
    "shard_dataset",
    "state",
    "stop_requested",
    "transform",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
