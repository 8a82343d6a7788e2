"""Warnings torch prints for layouts meshtrain builds on purpose, silenced with their reason.

Each filter is narrow (one message, the exact module classes meshtrain wrapped, or one kind of
collective) and installed by transform() in the rank's process, for the layout that triggers
it, never at import (docs/runtime-api.md lists them).
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterable

from torch import nn


def quiet_tensor_parallel_view_warnings(modules: Iterable[nn.Module | None]) -> None:
    """FSDP2's "returned a view tensor" for the TP embedding, the TP head and the root.

    Why it fires: with tensor parallelism the embedding and the head end in
    ``to_local()`` (``use_local_output=True``), which returns a view of the DTensor's local
    tensor, and the root returns those logits. FSDP2 then warns, once per module class and rank
    (12 lines for 4 ranks), that an in-place op on the view would drop its pre-backward hook.
    Why it is safe to silence here: the embedding output only enters the residual stream through
    out-of-place adds and the logits go to the loss (HF models and meshtrain's plans); a script
    that edits logits in place must ``.clone()`` them first (docs/tensor-parallel.md).
    """
    names = sorted({f"FSDP{type(m).__name__}" for m in modules if m is not None})
    if not names:
        return
    pattern = (r"FSDP2-wrapped module \((" + "|".join(re.escape(n) for n in names)
               + r")\) returned a view tensor")
    warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


def quiet_pipeline_stage_view_warnings(stages: Iterable[nn.Module]) -> None:
    """FSDP2's "returned a view tensor" for pipeline stages (the stage modules only).

    Why it fires: a stage ends where the model's code ends or where the next stage begins, and
    the model's own code often returns a view there: a biased ``nn.Linear`` head on 3-D
    activations returns a view of its 2-D matmul, ``logits.view(b, t, -1)`` is one, and so is
    a block output a stage passes on. FSDP2 warns, once per stage class and rank, that an
    in-place op on that view would drop the pre-backward hook it registers on the stage's
    outputs. Why it is safe to silence here: a stage's outputs go only to torch's pipeline
    schedule, which sends them to the next stage (a read) and back-propagates from them, and
    on the last stage to ``loss_fn`` through `meshtrain_runtime.forward_backward`; none of
    them edits the output in place (a loss_fn that does must ``.clone()`` first, as with
    tensor parallelism, docs/pipeline-parallel.md). Blocks and other FSDP2 modules still warn.
    """
    names = sorted({f"FSDP{type(m).__name__}" for m in stages})
    if not names:
        return
    pattern = (r"FSDP2-wrapped module \((" + "|".join(re.escape(n) for n in names)
               + r")\) returned a view tensor")
    warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"
_ADVICE = "While redistributing from"


class _DropExactGatherAdvice(logging.Filter):
    """Drops DTensor's "N sequential all_gather operations will be performed. This is
    suboptimal" record (its format's fourth argument is the collective), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        gather = len(args) >= 4 and args[3] == "all_gather"
        return not (gather and str(record.msg).startswith(_ADVICE))


def quiet_gather_order_advice() -> None:
    """DTensor's advice on full-tensor gathers over several mesh axes, on every rank of an EP
    job or of a TP job that FSDP2 shards too (idempotent).

    Why it fires: FSDP2 shards a weight over its data-parallel axis on top of a split it already
    has on another axis of the same tensor dim (the experts' ``ep`` split; tensor parallelism's
    ``Shard(0)``, ``_StridedShard`` then), so a full tensor (a full state dict, the export) is
    gathered by one all-gather per mesh axis, in an order torch cannot merge into one
    ("non-ascending order"). Why it is safe to silence: an all-gather copies shards and reduces
    nothing, so its order cannot change a value (the "inconsistent results" torch warns of come
    from reductions, whose advice is kept), and it runs at export or checkpoint time, not per
    step.
    """
    logger = logging.getLogger(REDISTRIBUTE_LOGGER)
    if not any(isinstance(f, _DropExactGatherAdvice) for f in logger.filters):
        logger.addFilter(_DropExactGatherAdvice())
