"""``torch.sagemaker.utils.utils``: small helpers AWS's example scripts use."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

_logger = logging.getLogger("torch.sagemaker")


@contextlib.contextmanager
def timeit(enabled: bool = True, message: str = "", rank: int | None = 0) -> Iterator[None]:
    """Log how long the block took (on rank `rank`, or every rank when None)."""
    start = time.perf_counter()
    yield
    if enabled:
        import torch.distributed as dist

        this = dist.get_rank() if dist.is_initialized() else 0
        if rank is None or rank == this:
            _logger.info("%s took %.3f s", message, time.perf_counter() - start)


__all__ = ["timeit"]
