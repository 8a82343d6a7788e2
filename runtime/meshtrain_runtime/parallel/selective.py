"""Op-level selective activation checkpointing: what a ``"selective"`` block keeps.

``activation_checkpointing: "selective"`` runs a block under torch's non-reentrant checkpoint
with ``context_fn`` = :func:`selective_contexts` (torch's
``create_selective_checkpoint_contexts``): during forward the outputs of the ops in
:func:`saved_ops` are cached beside the block's inputs, and the recompute in backward takes
them from the cache instead of running the op again; every other op is recomputed. The same
arrangement as torchtitan's ``selective_ac_option: "op"``, except that every matmul is kept
(torchtitan recomputes every second ``mm`` to save memory): the goal here is throughput, so
the expensive ops (the projections, fused attention) run once and the cheap ones (norms,
SiLU, rotary embeddings, residual adds, casts) twice.

Kept:

- matmuls: ``mm`` and ``addmm`` (``nn.Linear`` on any number of leading dims dispatches to
  one of them), ``_scaled_mm`` (float8 linears);
- fused attention kernels (output and logsumexp, no ``s x s`` tensor): SDPA's flash,
  memory-efficient, cuDNN and CPU flash kernels. An eager attention's score matmuls are
  ``bmm``, not kept: their ``s x s`` outputs are what checkpointing exists to drop;
- tensor parallelism's reduce-scatter output (sequence parallelism), so the recompute does
  not communicate it again, and ``max`` (float8's amax), as torchtitan keeps them.

Everything is looked up on ``torch.ops`` when first asked for (a torch without one of the
kernels simply has nothing to keep for it).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_SAVED_OP_NAMES = (
    ("aten", "mm"),
    ("aten", "addmm"),
    ("aten", "_scaled_mm"),
    ("aten", "_scaled_dot_product_flash_attention"),
    ("aten", "_scaled_dot_product_efficient_attention"),
    ("aten", "_scaled_dot_product_cudnn_attention"),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable"),
    ("aten", "max"),
    ("_c10d_functional", "reduce_scatter_tensor"),
)


@functools.cache
def saved_ops() -> frozenset[Any]:
    """The ``OpOverload``s whose outputs a selective block keeps (those this torch has)."""
    found = set()
    for namespace, name in _SAVED_OP_NAMES:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None:
            found.add(overload)
    return frozenset(found)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> tuple[Any, Any]:
    """The (forward, recompute) contexts of one selective block call: checkpoint's
    ``context_fn``."""
    return create_selective_checkpoint_contexts(_policy)


__all__ = ["saved_ops", "selective_contexts"]
