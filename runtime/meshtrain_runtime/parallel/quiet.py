"""Warnings torch prints for layouts meshtrain builds on purpose, silenced with their reason.

Each filter is narrow (one message, the exact module classes meshtrain wrapped) and installed by
transform() in the rank's process, never at import.
"""

from __future__ import annotations

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
