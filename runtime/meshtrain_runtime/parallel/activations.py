"""Activation checkpointing per transformer block, with optional activation offloading.

``apply_activation_checkpointing`` runs each chosen block's ``forward`` under torch's
non-reentrant ``torch.utils.checkpoint``. With ``policy="full"`` the block keeps only its
inputs during forward and recomputes the rest in backward; with ``policy="selective"`` it also
keeps the outputs of its matmuls and fused attention (torch's selective checkpointing, the ops
in :mod:`meshtrain_runtime.parallel.selective`) and recomputes only the ops between them. It
is applied after tensor parallelism and before FSDP2
(design.md's order); FSDP2's hooks sit on the module's ``__call__``, outside the checkpoint, so
parameters are gathered once before the recomputation, as torchtitan and Hugging Face do.

The block stays the same object with the same parameter names: only its class is swapped for a
subclass (keeping the class name) whose ``forward`` checkpoints, the way FSDP2 swaps classes.
State dicts, DCP checkpoints and ``find_blocks`` see the model unchanged.

With ``offload=True`` the inputs the checkpoint saves (the block's positional tensor arguments,
e.g. the hidden states) go to host memory; see :mod:`meshtrain_runtime.parallel.offload`.
Tensor keyword arguments (attention masks, rotary embeddings shared by every block) are kept by
reference by torch's checkpoint and are not offloaded: they are shared, so a copy frees nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from meshtrain.contract.distribution import CHECKPOINTING_POLICIES
from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.offload import (
    ActivationOffloader,
    NativeActivationOffloader,
    OffloadStats,
)
from meshtrain_runtime.parallel.selective import selective_contexts

if TYPE_CHECKING:
    from meshtrain.contract.distribution import SMPParameters

Offloader = ActivationOffloader | NativeActivationOffloader

_BLOCK_ATTR = "_meshtrain_checkpoint"
_OFFLOADER_ATTR = "_meshtrain_activation_offloader"
_OFFLOAD_COPY_DEVICES = {"cpu", "cuda", "meta"}
# Keyword arguments that make a block write a KV cache: a recompute would write it twice.
# transformers 5.24 renamed the decoder layers' `past_key_values` to `cache`.
_CACHE_KWARGS = ("cache", "past_key_values", "layer_past")


@dataclass(frozen=True)
class BlockCheckpoint:
    """What meshtrain attached to a checkpointed block."""

    index: int
    """Position of the block in the list given to ``apply_activation_checkpointing``."""
    offloader: Offloader | None
    policy: str = "full"
    """"full" (keep the inputs) or "selective" (keep matmul and attention outputs too)."""


def apply_activation_checkpointing(
    model: nn.Module,
    blocks: Sequence[nn.Module],
    *,
    policy: str = "full",
    interval: int = 1,
    offload: bool = False,
    native_offload: bool = False,
    loading_horizon: int = 2,
) -> nn.Module:
    """Checkpoint blocks 0, interval, 2*interval, ... of `blocks`, optionally offloading.

    Args:
        model: the root module (receives the end-of-forward hook that starts prefetching).
        blocks: the model's transformer blocks in forward order (``find_blocks(model)``).
        policy: "full" recomputes a checkpointed block whole; "selective" keeps the outputs of
            its matmuls and fused attention and recomputes the rest (op-level selective
            checkpointing). ``activation_checkpointing: True`` is "full".
        interval: ``activation_checkpointing_interval``; 1 checkpoints every block.
        offload: ``activation_offloading``: move the checkpointed blocks' saved inputs to host
            (a selective block's kept op outputs stay on the device).
        native_offload: ``not sm_activation_offloading``: use torch's ``save_on_cpu`` instead of
            meshtrain's offloader (no prefetch, so the horizon does not apply).
        loading_horizon: ``activation_loading_horizon``: most blocks whose offloaded inputs are
            on the device at once during backward (meshtrain's offloader only).

    Returns `model` (modified in place). Raises ConfigError for values that cannot work.
    """
    _check_policy(policy)
    _check_positive_int("activation_checkpointing_interval", interval)
    _check_positive_int("activation_loading_horizon", loading_horizon)
    blocks = list(blocks)
    _validate_blocks(model, blocks, offload=offload)
    offloader: Offloader | None = None
    if offload:
        offloader = _build_offloader(model, native=native_offload, loading_horizon=loading_horizon)
    for index, block in enumerate(blocks):
        if index % interval == 0:
            setattr(block, _BLOCK_ATTR,
                    BlockCheckpoint(index=index, offloader=offloader, policy=policy))
            block.__class__ = _checkpointed_class(type(block))
    return model


def resolve_activation_kwargs(parameters: SMPParameters) -> dict[str, Any] | None:
    """Keyword arguments for :func:`apply_activation_checkpointing` from the distribution keys.

    None when ``activation_checkpointing`` is off; True is the "full" policy.
    ``sm_activation_offloading`` picks the offload implementation exactly as in SMP (True:
    meshtrain's with prefetch; False: torch's).
    """
    if parameters.checkpointing_policy == "none":
        return None
    return {
        "policy": parameters.checkpointing_policy,
        "interval": parameters.activation_checkpointing_interval,
        "offload": parameters.activation_offloading,
        "native_offload": not parameters.sm_activation_offloading,
        "loading_horizon": parameters.activation_loading_horizon,
    }


def get_activation_offloader(model: nn.Module) -> Offloader | None:
    """The offloader `apply_activation_checkpointing(model, ..., offload=True)` installed."""
    return getattr(model, _OFFLOADER_ATTR, None)


def get_offload_stats(model: nn.Module) -> OffloadStats | None:
    """Counters of the model's offloader (None without offloading)."""
    offloader = get_activation_offloader(model)
    return offloader.stats if offloader is not None else None


def checkpointed_blocks(model: nn.Module) -> list[nn.Module]:
    """The submodules of `model` that run under activation checkpointing, in module order."""
    return [m for m in model.modules() if _BLOCK_ATTR in m.__dict__]


# --- validation -----------------------------------------------------------------------------
def _check_policy(policy: Any) -> None:
    if policy not in CHECKPOINTING_POLICIES:
        raise ConfigError(
            f"policy={policy!r} is not a checkpointing policy. Use 'full' (a block keeps its "
            "inputs and recomputes everything) or 'selective' (it also keeps its matmul and "
            "attention outputs)."
        )


def _check_positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"{key}={value!r}: must be an integer >= 1. "
            + (
                "Use 1 to checkpoint every block, n to checkpoint blocks 0, n, 2n, ..."
                if key == "activation_checkpointing_interval"
                else "It is the number of offloaded blocks that may be back on the device at "
                "once during backward; 2 (the default) overlaps one copy with one block."
            )
        )


def _validate_blocks(model: nn.Module, blocks: list[nn.Module], *, offload: bool) -> None:
    feature = "activation_offloading" if offload else "activation_checkpointing"
    if not blocks:
        raise ConfigError(
            f"{feature}=True but no transformer blocks were found in "
            f"{type(model).__name__}: checkpointing (and offloading, which moves the inputs "
            "of checkpointed blocks) works per block. Pass the blocks explicitly (e.g. "
            "list(model.model.layers)) or turn activation_checkpointing off."
        )
    names = {id(m): name for name, m in model.named_modules()}
    for index, block in enumerate(blocks):
        if not isinstance(block, nn.Module) or id(block) not in names:
            raise ConfigError(
                f"blocks[{index}] ({type(block).__name__}) is not a submodule of "
                f"{type(model).__name__}; pass the blocks of the model being transformed."
            )
        _check_not_checkpointed(block, names[id(block)] or "<root>")
    if len({id(b) for b in blocks}) != len(blocks):
        raise ConfigError("blocks lists the same module twice; list each block once.")
    _check_not_nested(blocks, names)
    if offload:
        _check_offload_devices(model)


def _check_not_checkpointed(block: nn.Module, name: str) -> None:
    if _BLOCK_ATTR in block.__dict__:
        raise ConfigError(
            f"block {name!r} is already checkpointed by meshtrain; apply activation "
            "checkpointing once per model."
        )
    if getattr(block, "gradient_checkpointing", False):
        raise ConfigError(
            f"block {name!r} already has Hugging Face's own checkpointing on "
            "(model.activation_checkpointing_enable()); checkpointing it twice recomputes twice. "
            "Call model.activation_checkpointing_disable() or leave activation_checkpointing off."
        )


def _check_not_nested(blocks: list[nn.Module], names: dict[int, str]) -> None:
    chosen = {id(b) for b in blocks}
    for block in blocks:
        for inner in block.modules():
            if inner is not block and id(inner) in chosen:
                raise ConfigError(
                    f"block {names[id(inner)]!r} lies inside block {names[id(block)]!r}: nested "
                    "blocks would be checkpointed twice. Pass only the outermost blocks."
                )


def _check_offload_devices(model: nn.Module) -> None:
    devices = {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()}
    odd = sorted(devices - _OFFLOAD_COPY_DEVICES)
    if odd:
        raise ConfigError(
            f"activation_offloading copies activations between host and CUDA memory, but the "
            f"model has tensors on {odd}. Move the model to CUDA (or CPU), or set "
            "activation_offloading=False."
        )


def _build_offloader(model: nn.Module, *, native: bool, loading_horizon: int) -> Offloader:
    if get_activation_offloader(model) is not None:
        raise ConfigError(
            f"{type(model).__name__} already has an activation offloader; apply activation "
            "checkpointing with offloading once per model."
        )
    offloader: Offloader = (
        NativeActivationOffloader() if native else ActivationOffloader(loading_horizon)
    )
    setattr(model, _OFFLOADER_ATTR, offloader)
    model.register_forward_hook(_on_root_forward_end)
    return offloader


def _on_root_forward_end(module: nn.Module, args: Any, output: Any) -> None:
    # SMP starts prefetching when the root forward ends (its offload_wrapper's role). The
    # offloader is looked up on the module so that a deep copy uses its own.
    offloader = get_activation_offloader(module)
    if offloader is not None:
        offloader.on_forward_end()


# --- the checkpointed forward ---------------------------------------------------------------
@functools.cache
def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    """Subclass of `cls` whose forward checkpoints; same name so repr and matching hold."""

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        inner = super(checkpointed, self).forward
        return _run_checkpointed(self, inner, args, kwargs)

    checkpointed = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    checkpointed.__qualname__ = cls.__qualname__
    return checkpointed


def _run_checkpointed(
    block: nn.Module, inner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    if not torch.is_grad_enabled():  # nothing is saved for backward: run as is
        return inner(*args, **kwargs)
    spec: BlockCheckpoint = block.__dict__[_BLOCK_ATTR]
    kwargs = _without_cache_writes(block, kwargs)
    # the selective policy: torch's selective checkpointing contexts (checkpoint's own keyword)
    context = {"context_fn": selective_contexts} if spec.policy == "selective" else {}
    if spec.offloader is None:
        return checkpoint(inner, *args, use_reentrant=False, **context, **kwargs)
    if not any(isinstance(a, torch.Tensor) for a in args):
        raise ConfigError(
            f"activation_offloading: block {spec.index} ({type(block).__name__}) was called "
            "with no positional tensor argument, so its checkpoint saves no input to offload. "
            "Call the block with its hidden states positionally, or set "
            "activation_offloading=False."
        )
    with spec.offloader.block_hooks():
        return checkpoint(inner, *args, use_reentrant=False, **context, **kwargs)


def _without_cache_writes(block: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop KV-cache writes as Hugging Face's own checkpointing does: a recompute repeats them.

    Blocks that only read the cache (HF's ``_can_checkpoint_with_cache``) keep it.
    """
    drop = () if getattr(block, "_can_checkpoint_with_cache", False) else _CACHE_KWARGS
    if kwargs.get("use_cache") or any(kwargs.get(key) is not None for key in drop):
        kwargs = dict(kwargs)
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        for key in drop:
            if key in kwargs:
                kwargs[key] = None
    return kwargs


__all__ = [
    "BlockCheckpoint",
    "apply_activation_checkpointing",
    "checkpointed_blocks",
    "get_activation_offloader",
    "get_offload_stats",
    "resolve_activation_kwargs",
]
