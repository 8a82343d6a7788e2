"""``torch.sagemaker.checkpoint.utils``: keep the newest N checkpoint sub-directories."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable

_logger = logging.getLogger("torch.sagemaker")


def _last_int(name: str) -> int:
    numbers = re.findall(r"\d+", name)
    return int(numbers[-1]) if numbers else -1


SORT_BY_LAST_INT: Callable[[str], int] = _last_int
"""Sort key: the last integer in a directory name (``llama_v3-12steps`` -> 12)."""


def limit_num_subdirs(
    root_dir: str,
    num_kept: int,
    sort_fn: Callable[[str], object] = SORT_BY_LAST_INT,
    regex: str = r".*",
    log: bool = True,
) -> list[str]:
    """Remove all but the `num_kept` newest sub-directories of `root_dir` matching `regex`.

    `root_dir` may be a checkpoint directory itself (as AWS's example passes it): then its parent
    is scanned. Returns the removed paths. ``num_kept <= 0`` keeps everything.
    """
    root = root_dir if not re.match(regex, os.path.basename(root_dir)) else os.path.dirname(
        root_dir
    )
    if num_kept <= 0 or not os.path.isdir(root):
        return []
    names = sorted(
        (n for n in os.listdir(root)
         if re.match(regex, n) and os.path.isdir(os.path.join(root, n))),
        key=sort_fn,
    )
    removed = [os.path.join(root, n) for n in names[:-num_kept]]
    for path in removed:
        if log:
            _logger.info("Removing old checkpoint %s", path)
        shutil.rmtree(path, ignore_errors=True)
    return removed


__all__ = ["SORT_BY_LAST_INT", "limit_num_subdirs"]
