"""The one table of torch entry points SMP's flow patches while ``tsm.init`` is in effect.

SMP v2 patches FSDP inside ``tsm.init()`` so that a script's own FSDP call shards over SMP's
group; meshtrain does the same, reversibly, on public torch names only (no private function):

- ``FullyShardedDataParallel.__init__`` (FSDP1): SMP's mesh and strategy when the script passes
  no group or mesh; SMP's extra keyword ``post_param_init_fn``;
- ``FullyShardedDataParallel.optim_state_dict`` / ``optim_state_dict_to_load``: SMP's
  optimizer-state format of FSDP1 + tensor parallelism;
- ``fully_shard``'s ``mesh`` keyword default (FSDP2): SMP's data-parallel mesh instead of a new
  1-D world mesh (a script that passes ``mesh=None`` explicitly gets torch's default).

The FSDP1 patches replace attributes of the class object and the FSDP2 one sets the keyword
default of the function that ``fully_shard`` wraps (its ``__kwdefaults__``), so names a script
imported before ``tsm.init`` see them. The FSDP1 wrappers call torch's originals positionally,
so they depend on the parameter lists in `CHECKED_SIGNATURES`; the ``fully_shard`` patch only
on its keyword ``mesh`` (torch 2.12 added a parameter after it). They were read on every torch
in `CHECKED_TORCH_VERSIONS` (CI's version tier runs
tests/runtime/compat/test_smp_units.py::test_patched_torch_signatures_are_the_checked_ones on
each, which fails when torch changes one of them), and the 4-rank SMP tests exercise each patch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

from meshtrain_runtime.torch_api import TESTED_TORCH_VERSIONS

CHECKED_TORCH_VERSIONS = TESTED_TORCH_VERSIONS
"""torch releases whose patched symbols were read and whose signatures are recorded below."""

CHECKED_SIGNATURES: dict[str, tuple[str, ...]] = {
    "FullyShardedDataParallel.__init__": (
        "self", "module", "process_group", "sharding_strategy", "cpu_offload",
        "auto_wrap_policy", "backward_prefetch", "mixed_precision", "ignored_modules",
        "param_init_fn", "device_id", "sync_module_states", "forward_prefetch",
        "limit_all_gathers", "use_orig_params", "ignored_states", "device_mesh",
    ),
    "FullyShardedDataParallel.optim_state_dict": ("model", "optim", "optim_state_dict", "group"),
    "FullyShardedDataParallel.optim_state_dict_to_load": (
        "model", "optim", "optim_state_dict", "is_named_optimizer", "load_directly", "group",
    ),
    "fully_shard": ("module", "mesh"),
}
"""Parameter names, in order, of each patched symbol as `CHECKED_TORCH_VERSIONS` define it
(``fully_shard``: its first two, all the patch relies on)."""

_FSDP1_STATIC = ("optim_state_dict", "optim_state_dict_to_load")
_original: dict[str, Any] = {}


def live_signatures() -> dict[str, tuple[str, ...]]:
    """The parameter names of the patched symbols in the torch imported now (unpatched)."""
    symbols = {
        "FullyShardedDataParallel.__init__": _original.get("__init__",
                                                           FullyShardedDataParallel.__init__),
        **{f"FullyShardedDataParallel.{name}": _original.get(
            name, getattr(FullyShardedDataParallel, name)) for name in _FSDP1_STATIC},
        "fully_shard": _fully_shard_function(),
    }
    found = {name: tuple(inspect.signature(fn).parameters) for name, fn in symbols.items()}
    found["fully_shard"] = found["fully_shard"][:2]
    return found


def _fully_shard_function() -> Callable[..., Any]:
    """The function torch's ``contract`` decorator wraps as ``fully_shard`` (its defaults)."""
    return inspect.unwrap(fully_shard)


def install(
    *,
    fsdp1_init: Callable[[Callable[..., None]], Callable[..., None]],
    optim_state_dict: Callable[[Callable[..., Any]], Callable[..., Any]],
    optim_state_dict_to_load: Callable[[Callable[..., Any]], Callable[..., Any]],
    fully_shard_mesh: DeviceMesh,
) -> None:
    """Wrap the FSDP1 entry points (each ``wrap(original)``) and set ``fully_shard``'s default
    mesh (idempotent: a second call only moves the default mesh)."""
    if "__init__" not in _original:
        _original["__init__"] = FullyShardedDataParallel.__init__
        FullyShardedDataParallel.__init__ = fsdp1_init(_original["__init__"])
    for name, wrap in zip(_FSDP1_STATIC, (optim_state_dict, optim_state_dict_to_load),
                          strict=True):
        if name not in _original:
            _original[name] = getattr(FullyShardedDataParallel, name)
            setattr(FullyShardedDataParallel, name, staticmethod(wrap(_original[name])))
    defaults = _fully_shard_function().__kwdefaults__
    _original.setdefault("fully_shard.mesh", defaults["mesh"])
    defaults["mesh"] = fully_shard_mesh


def remove() -> None:
    """Give torch its own entry points and defaults back."""
    if "__init__" in _original:
        FullyShardedDataParallel.__init__ = _original.pop("__init__")
    for name in _FSDP1_STATIC:
        if name in _original:
            setattr(FullyShardedDataParallel, name, staticmethod(_original.pop(name)))
    if "fully_shard.mesh" in _original:
        _fully_shard_function().__kwdefaults__["mesh"] = _original.pop("fully_shard.mesh")


def is_installed() -> bool:
    """True while any patch of this table is in place."""
    return bool(_original)


__all__ = ["CHECKED_SIGNATURES", "CHECKED_TORCH_VERSIONS", "install", "live_signatures",
           "remove"]
