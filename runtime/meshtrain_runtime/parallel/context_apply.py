"""Context parallelism on a whole model: what ``transform`` installs at ``context_parallel_degree``
> 1 on top of the attention in ``meshtrain_runtime.parallel.context``.

Every rank of a cp group runs the model on its chunks of each sequence (SMP's load-balanced
layout: 2 x cp chunks, rank r holds chunks r and 2cp-1-r). What the model needs for that:

- Hugging Face models: attention runs through a registered attention function
  (``"meshtrain_context"``, transformers' AttentionInterface) that calls ``context_attention``
  with is_causal. HF builds no mask for an implementation it does not know, which is what CP
  needs: the local chunks' global position ids jump at the chunk border, and HF's SDPA path
  would read that jump as two packed sequences and mask across it. The root forward gives the
  chunks' GLOBAL ``position_ids`` to rotary embeddings when the script passes none, and shifts
  ``labels=`` over the whole sequence (HF shifts inside the chunk, which is wrong at every chunk
  border): the labels are gathered over the cp group, shifted, split again and passed as
  ``shift_labels`` with ``num_items_in_batch`` = the targets of the whole sequences / cp, so the
  cp ranks' losses average (FSDP's gradient mean) to one process's loss. No KV cache is kept
  (``use_cache=False``): it would hold local chunks only.
- Other modules: every ``F.scaled_dot_product_attention`` call in the root's and the blocks'
  forwards runs as ``context_attention`` (the core's ``sdpa_dispatch``). The blocks carry it in
  their own forward so that activation checkpointing's recompute, which runs a block's forward
  again during backward, attends across the cp ranks too.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.context import (
    COMM_TYPES,
    context_attention,
    context_parallel_unshard,
    local_positions,
    sdpa_dispatch,
)
from meshtrain_runtime.parallel.context import context_parallel_shard as shard_chunks

HF_ATTENTION = "meshtrain_context"
_ATTR = "_meshtrain_context_parallel"
_IGNORE = -100  # cross-entropy's ignore_index (HF's and torch's default)
_active = threading.local()  # one dispatch at a time: a block inside the root's forward


@dataclass(frozen=True)
class ContextSettings:
    """The cp group and how attention crosses it (plain values, never the runtime config)."""

    group: dist.ProcessGroup
    cp_rank: int
    cp_size: int
    comm_type: str = "p2p"
    layout: str = "load_balanced"
    tp_size: int = 1  # tensor parallelism splits the heads first (a2a scatters the rest)


def check_comm_type(comm_type: str) -> None:
    """Refuse a cp_comm_type that is not p2p, all_gather or a2a."""
    if comm_type not in COMM_TYPES:
        raise ConfigError(
            f"cp_comm_type={comm_type!r} is not one of {', '.join(map(repr, COMM_TYPES))}: "
            "'p2p' (a ring of key/value sends, the default), 'all_gather' (every rank gathers "
            "all keys/values) or 'a2a' (Ulysses: heads scattered by all-to-all).")


def is_hf_model(model: nn.Module) -> bool:
    """A transformers model that routes attention through its AttentionInterface."""
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "_attn_implementation") and hasattr(
        model, "set_attn_implementation")


def check_context_parallel(model: nn.Module, settings: ContextSettings) -> None:
    """What `apply_context_parallel` refuses, checked before anything changes the model."""
    check_comm_type(settings.comm_type)
    if settings.cp_size > 1 and is_hf_model(model):
        _check_hf_heads(model, settings)


def apply_context_parallel(
    model: nn.Module, blocks: list[nn.Module], settings: ContextSettings
) -> nn.Module:
    """Make `model` run on its cp rank's chunks with exact attention over whole sequences.

    Call it after tensor parallelism and before activation checkpointing (whose recompute must
    run the blocks' attention across the cp group too). Returns `model`, changed in place.
    """
    check_context_parallel(model, settings)
    if settings.cp_size == 1:
        return model
    hf = is_hf_model(model)
    if hf:
        AttentionInterface = _attention_interface()
        AttentionInterface.register(HF_ATTENTION, hf_context_attention)
        model.set_attn_implementation(HF_ATTENTION)
        for module in model.modules():  # the attention function reads them from its module
            module.__dict__[_ATTR] = settings
    else:
        for module in [model, *blocks]:
            module.__dict__[_ATTR] = settings
        for block in blocks:
            block.__class__ = _dispatching_class(type(block))
    model.__dict__[_ATTR] = settings
    model.__class__ = _hf_root_class(type(model)) if hf else _dispatching_class(type(model))
    return model


def _attention_interface() -> Any:
    from transformers import AttentionInterface

    return AttentionInterface


def _check_hf_heads(model: nn.Module, settings: ContextSettings) -> None:
    heads = getattr(model.config, "num_attention_heads", None)
    if settings.comm_type != "a2a" or heads is None:
        return
    local, cp = heads // settings.tp_size, settings.cp_size
    if local % cp:  # key/value heads are repeated to the query heads when they do not divide
        per_tp = f" / tensor_parallel_degree {settings.tp_size} = {local}" if (
            settings.tp_size > 1) else ""
        raise ConfigError(
            f"cp_comm_type='a2a' (Ulysses) scatters attention heads over the {cp} cp ranks, "
            f"but each rank has {heads} query heads{per_tp} ({local} % {cp} = {local % cp}). "
            "Use cp_comm_type 'p2p' or 'all_gather', or a cp degree that divides the heads.")


# --- Hugging Face: the attention function and the root forward ------------------------------
def hf_context_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    is_causal: bool | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (b, h, s, d) in, (b, s, h, d) out."""
    settings: ContextSettings = module.__dict__[_ATTR]
    window = kwargs.get("sliding_window")
    if window is not None and window < query.shape[2] * settings.cp_size:
        raise ConfigError(
            f"{type(module).__name__} uses sliding-window attention (window {window}) over a "
            f"sequence of {query.shape[2] * settings.cp_size} tokens: context parallelism "
            "computes exact causal attention over the whole sequence. Use a model without a "
            "sliding window, or sequences no longer than the window.")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = context_attention(
        query, key, value, group=settings.group, comm_type=settings.comm_type,
        is_causal=causal, scale=scaling, layout=settings.layout, attn_mask=attention_mask,
        dropout_p=dropout)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _hf_root_class(cls: type[nn.Module]) -> type[nn.Module]:
    """Subclass of an HF model whose forward injects global positions and shifts labels."""
    original = cls.forward
    signature = inspect.signature(original)
    var_kw = next((p.name for p in signature.parameters.values()
                   if p.kind is inspect.Parameter.VAR_KEYWORD), None)

    @functools.wraps(original)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(self, *args, **kwargs).arguments
        extra = bound.pop(var_kw, {}) if var_kw else {}
        bound.pop(next(iter(signature.parameters)))  # self
        call = prepare_hf_inputs({**bound, **extra}, self.__dict__[_ATTR])
        if "use_cache" in signature.parameters:  # a KV cache holds local chunks only, and a
            call["use_cache"] = False  # checkpoint recompute would append to it a second time
        return original(self, **call)

    return _subclass(cls, forward)


def prepare_hf_inputs(call: dict[str, Any], settings: ContextSettings) -> dict[str, Any]:
    """The keyword arguments of one HF forward on local chunks, made right for CP."""
    tokens = call.get("input_ids")
    tokens = tokens if tokens is not None else call.get("inputs_embeds")
    if tokens is None:
        raise ConfigError("context parallelism needs input_ids or inputs_embeds (the chunks).")
    _drop_full_attention_mask(call)
    positions = call.get("position_ids")
    if positions is None:
        positions = local_positions(tokens.shape[1], settings.cp_rank, settings.cp_size,
                                    settings.layout, device=tokens.device)
    if positions.dim() == 1:  # context_parallel_shard's positions: one row for the batch
        positions = positions.unsqueeze(0).expand(tokens.shape[0], -1)
    call["position_ids"] = positions
    if call.get("labels") is not None:
        _shift_labels_globally(call, settings)
    return call


def _drop_full_attention_mask(call: dict[str, Any]) -> None:
    mask = call.get("attention_mask")
    if mask is None:
        return
    if mask.dim() == 2 and bool(mask.bool().all()):
        call["attention_mask"] = None  # nothing masked: plain causal attention
        return
    raise ConfigError(
        "attention_mask with masked (padding) positions under context parallelism: a mask spans "
        "the whole sequence, which no cp rank holds. Pass attention_mask=None and mark padded "
        "targets -100 (ignored by the loss), or pack sequences without padding.")


def _shift_labels_globally(call: dict[str, Any], settings: ContextSettings) -> None:
    """labels= -> shift_labels over the whole sequence, num_items_in_batch over the cp group."""
    local = call.get("shift_labels")
    if local is None:
        labels = call["labels"]
        full = context_parallel_unshard(labels.contiguous(), 1, settings.group, settings.layout)
        shifted = torch.nn.functional.pad(full[:, 1:], (0, 1), value=_IGNORE)
        (local,), _ = shard_chunks(shifted, seq_dim=1, cp_rank=settings.cp_rank,
                                             cp_size=settings.cp_size, layout=settings.layout)
        call["shift_labels"] = local
    items = call.get("num_items_in_batch")
    if items is None:  # the whole sequences' targets, counted over the cp group
        items = (local != _IGNORE).sum()
        dist.all_reduce(items, group=settings.group)
    # each rank's loss is its sum / (items / cp): FSDP's mean over the cp ranks is sum / items
    call["num_items_in_batch"] = torch.as_tensor(items, dtype=torch.float32) / settings.cp_size


# --- plain modules: F.scaled_dot_product_attention through the core's dispatch --------------
@contextmanager
def _dispatch(settings: ContextSettings) -> Iterator[None]:
    """The core's sdpa_dispatch, entered once however deep blocks nest in the root."""
    if getattr(_active, "on", False):
        yield
        return
    _active.on = True
    try:
        with sdpa_dispatch(settings.group, settings.comm_type, settings.layout):
            yield
    finally:
        _active.on = False


@functools.cache
def _dispatching_class(cls: type[nn.Module]) -> type[nn.Module]:
    """Subclass of `cls` whose forward runs under the dispatch (same name, for repr/matching)."""
    original = cls.forward

    @functools.wraps(original)
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        with _dispatch(self.__dict__[_ATTR]):
            return original(self, *args, **kwargs)

    return _subclass(cls, forward)


def _subclass(cls: type[nn.Module], forward: Callable[..., Any]) -> type[nn.Module]:
    sub = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    sub.__qualname__ = cls.__qualname__
    return sub


def context_settings(model: nn.Module) -> ContextSettings | None:
    """The settings `apply_context_parallel` left on `model` (None without CP)."""
    return model.__dict__.get(_ATTR)


__all__ = [
    "HF_ATTENTION",
    "ContextSettings",
    "apply_context_parallel",
    "check_comm_type",
    "check_context_parallel",
    "context_settings",
    "hf_context_attention",
    "is_hf_model",
    "prepare_hf_inputs",
]
