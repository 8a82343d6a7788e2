"""The global order: which samples global batch k holds, as a pure function.

Epoch e reads the samples in the order ``permutation(seed, e, fingerprint)`` (or 0..N-1 without
shuffling); its batches are consecutive slices of ``global_batch_size`` samples of that order,
and the samples after the last whole batch are left out of that epoch (other ones each epoch
when shuffled). Nothing depends on the number of ranks, hosts or workers: data-parallel rank r
of D takes the contiguous slice r of each global batch.

A `Cursor` anchors the arithmetic: batch ``cursor.batch`` starts at sample ``cursor.offset`` of
epoch ``cursor.epoch``. A fresh run's cursor is (0, 0, 0); a resume's is the position the
checkpoint saved, so a resume with another global batch size continues at the next unread
sample. `locate` maps any later batch to its epoch and offset in O(1).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Cursor:
    """Global batch `batch` starts at sample `offset` of epoch `epoch`'s order."""

    batch: int = 0
    epoch: int = 0
    offset: int = 0


def fingerprint_key(fingerprint: dict[str, Any]) -> int:
    """A 64-bit number drawn from the fingerprint: part of every epoch's shuffle."""
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "little")


@lru_cache(maxsize=2)
def epoch_order(num_samples: int, seed: int, epoch: int, key: int, shuffle: bool) -> np.ndarray:
    """Sample ids of epoch `epoch` in reading order (cached: a batch reads one epoch at a time)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    generator = np.random.Generator(np.random.PCG64([seed, epoch, key]))
    return generator.permutation(num_samples)


def locate(cursor: Cursor, batch: int, batch_size: int, num_samples: int) -> tuple[int, int]:
    """(epoch, offset) of global batch `batch` (>= cursor.batch)."""
    if batch < cursor.batch:
        raise ValueError(f"batch {batch} is before the cursor's batch {cursor.batch}")
    per_epoch = num_samples // batch_size
    left_in_first = max(0, (num_samples - cursor.offset) // batch_size)
    later = batch - cursor.batch
    if later < left_in_first:
        return cursor.epoch, cursor.offset + later * batch_size
    later -= left_in_first
    return cursor.epoch + 1 + later // per_epoch, (later % per_epoch) * batch_size


def batches_until(cursor: Cursor, epochs: int, batch_size: int, num_samples: int) -> int:
    """The global batch count at the end of epoch `epochs - 1`, reading on from `cursor`."""
    if cursor.epoch >= epochs:
        return cursor.batch
    first = max(0, (num_samples - cursor.offset) // batch_size)
    return cursor.batch + first + (epochs - 1 - cursor.epoch) * (num_samples // batch_size)


def advance(cursor: Cursor, batch: int, batch_size: int, num_samples: int) -> Cursor:
    """The cursor of global batch `batch` (the next one to read), normalised: an epoch with no
    whole batch left is written as the start of the next one."""
    epoch, offset = locate(cursor, batch, batch_size, num_samples)
    return Cursor(batch, epoch, offset)


__all__ = ["Cursor", "advance", "batches_until", "epoch_order", "fingerprint_key", "locate"]
