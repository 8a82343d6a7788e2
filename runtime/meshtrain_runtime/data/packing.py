"""Samples of ``seq_len + 1`` tokens, addressed by index: packed token streams and fixed rows.

A *stream* is documents laid end to end (text gets EOS after each document when it is
tokenized; pre-tokenized sequences are laid as they are). Packing cuts it into consecutive,
non-overlapping windows of ``seq_len + 1`` tokens: sample i is tokens ``[i*W, (i+1)*W)``, the
tail shorter than a window is not used. Nothing is carried from one sample to the next, so any
sample is read without reading the ones before it (a resume costs nothing per consumed batch).
*Rows* are samples that already have ``seq_len + 1`` tokens (a 2-D ``.npy``, a dataset of
equal-length sequences): sample i is row i, read as it is.

Position ids restart at 0 at every document start the stream knows (for document masking);
rows and streams without document boundaries count from each sample's first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshtrain.contract.errors import ConfigError


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest integer type that holds ids below `vocab_size` (memory of tokenized text)."""
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    return np.dtype(np.int32) if vocab_size <= np.iinfo(np.int32).max else np.dtype(np.int64)


class ArrayStream:
    """A stream held as one array (tokenized text, a memory-mapped 1-D ``.npy`` or ``.bin``)."""

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray | None = None) -> None:
        self.tokens = tokens
        self.total = int(tokens.shape[0])
        self.doc_starts = doc_starts

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.tokens[start:stop])


class DocStream:
    """Documents read one by one (a map-style dataset, non-contiguous ``.bin`` sequences)."""

    def __init__(self, get_doc: Callable[[int], np.ndarray], lengths: np.ndarray) -> None:
        self.get_doc = get_doc
        self.doc_starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]])
        self.total = int(lengths.sum())

    def read(self, start: int, stop: int) -> np.ndarray:
        first = int(np.searchsorted(self.doc_starts, start, side="right")) - 1
        pieces, position = [], start
        doc = first
        while position < stop:
            begin = int(self.doc_starts[doc])
            tokens = np.asarray(self.get_doc(doc))
            pieces.append(tokens[position - begin:stop - begin])
            position = begin + len(tokens)
            doc += 1
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


class ChainStream:
    """Several streams (files) laid end to end; their documents, when they all know them."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = list(parts)
        totals = [part.total for part in self.parts]
        self.starts = np.concatenate([[0], np.cumsum(totals, dtype=np.int64)[:-1]])
        self.total = int(sum(totals))
        known = all(part.doc_starts is not None for part in self.parts)
        self.doc_starts = np.concatenate([
            part.doc_starts + start for part, start in zip(self.parts, self.starts, strict=True)
        ]) if known else None

    def read(self, start: int, stop: int) -> np.ndarray:
        pieces = []
        index = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            base = int(self.starts[index])
            part = self.parts[index]
            end = min(stop, base + part.total)
            pieces.append(part.read(start - base, end - base))
            start, index = end, index + 1
        return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


class PackedSamples:
    """Consecutive windows of `window` tokens of a stream."""

    packing = "packed"

    def __init__(self, stream: Any, window: int) -> None:
        self.stream = stream
        self.window = window
        self.num_samples = stream.total // window

    def sample(self, index: int) -> np.ndarray:
        start = index * self.window
        return self.stream.read(start, start + self.window)

    def positions(self, index: int) -> np.ndarray:
        start = index * self.window
        where = np.arange(start, start + self.window, dtype=np.int64)
        starts = self.stream.doc_starts
        if starts is None:
            return where - start
        return where - starts[np.searchsorted(starts, where, side="right") - 1]


class RowSamples:
    """Samples that already have `window` tokens: row i of one or more 2-D arrays, or item i."""

    packing = "rows"

    def __init__(self, get_row: Callable[[int], np.ndarray], num_rows: int, window: int) -> None:
        self.get_row = get_row
        self.num_samples = num_rows
        self.window = window

    def sample(self, index: int) -> np.ndarray:
        return np.asarray(self.get_row(index))

    def positions(self, index: int) -> np.ndarray:
        return np.arange(self.window, dtype=np.int64)


class ArrayRows:
    """Row getter over several 2-D arrays laid one after another (picklable, for workers)."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = list(arrays)
        self.starts = np.cumsum([0] + [a.shape[0] for a in self.arrays], dtype=np.int64)

    def __call__(self, index: int) -> np.ndarray:
        part = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self.arrays[part][index - int(self.starts[part])]

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])


def pack_documents(documents: Sequence[np.ndarray], *, eos: int | None,
                   vocab_size: int) -> ArrayStream:
    """Documents end to end in one array (EOS after each when `eos` is given)."""
    lengths = np.fromiter((len(d) for d in documents), dtype=np.int64, count=len(documents))
    extra = 0 if eos is None else 1
    starts = np.concatenate([[0], np.cumsum(lengths + extra)[:-1]]).astype(np.int64)
    tokens = np.empty(int(lengths.sum()) + extra * len(documents), dtype=token_dtype(vocab_size))
    for document, start, length in zip(documents, starts, lengths, strict=True):
        tokens[start:start + length] = document
        if eos is not None:
            tokens[start + length] = eos
    return ArrayStream(tokens, starts)


def window_of(seq_len: int | None, what: str) -> int:
    """seq_len + 1, or a ConfigError when a packed source is given no seq_len."""
    if seq_len is None:
        raise ConfigError(f"{what} is cut into samples of seq_len + 1 tokens, so "
                          "loader(..., seq_len=N) is required. Pass the model's sequence length.")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ConfigError(f"loader(seq_len={seq_len!r}): seq_len is the tokens per sample the "
                          "model reads, an int >= 1.")
    return seq_len + 1


__all__ = ["ArrayRows", "ArrayStream", "ChainStream", "DocStream", "PackedSamples",
           "RowSamples", "pack_documents", "token_dtype", "window_of"]
