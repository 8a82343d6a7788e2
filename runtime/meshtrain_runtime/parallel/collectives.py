"""torch.distributed calls whose names changed across the torch releases meshtrain supports.

torch 2.13 deprecates ``all_gather_into_tensor`` for ``all_gather_single`` (the same collective):
every call printed a FutureWarning on every rank of a TP x EP job. Releases before it (meshtrain
supports torch >= 2.6) have only the old name, so the call goes through here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_gather_into(output: torch.Tensor, local: torch.Tensor, group: Any = None) -> None:
    """Every rank's `local` (one size everywhere) into `output`, in group rank order."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, local, group=group)
