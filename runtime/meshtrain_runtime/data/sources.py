"""Any source a loader takes -> its samples and its fingerprint.

Sources: a channel name or a local file or directory (``channels.py``; formats in
``formats.py``), a Hugging Face ``datasets.Dataset``, or any map-style dataset of token
sequences (``__len__`` and ``__getitem__``: a torch Dataset, a list). Text is tokenized and
packed with EOS after each document; token sequences of exactly ``seq_len + 1`` tokens are
samples as they are, other token sequences are packed as they are (their own separators kept).

The fingerprint says what the samples are made of: the files (relative names, sizes and a
digest of their first and last 64 KiB), or the dataset (its type, rows and a digest of its first
and last rows); the tokenizer; seq_len; the packing; the text field. A resume compares it with
the checkpoint's, and the global order is drawn from it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.data import formats
from meshtrain_runtime.data.channels import resolve_location
from meshtrain_runtime.data.packing import (
    ArrayRows,
    ArrayStream,
    ChainStream,
    DocStream,
    PackedSamples,
    RowSamples,
    pack_documents,
    window_of,
)
from meshtrain_runtime.data.tokenize import resolve_tokenizer

DIGEST_BYTES = 64 * 1024  # a file's fingerprint reads its first and last 64 KiB


@dataclass(frozen=True)
class SourceData:
    """What a loader reads: samples by index, and what identifies them."""

    samples: PackedSamples | RowSamples
    fingerprint: dict[str, Any]
    vocab_size: int | None
    eos_token_id: int | None
    description: str


@dataclass(frozen=True)
class SourceOptions:
    seq_len: int | None
    tokenizer: Any
    text_field: str


def open_source(source: Any, options: SourceOptions) -> SourceData:
    """Index `source` (read its files, tokenize text) into samples of seq_len + 1 tokens."""
    if isinstance(source, str | os.PathLike):
        return _open_location(resolve_location(source), options)
    if _is_hf_dataset(source):
        records = formats.dataset_records(source, options.text_field, "the dataset")
        identity = {"dataset": type(source).__name__, "rows": len(source),
                    "columns": list(source.column_names), "sha256": _rows_digest(records)}
        return _from_records(records, identity, options, "a datasets.Dataset")
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        return _open_token_dataset(source, options)
    raise ConfigError(
        f"loader() cannot read a {type(source).__name__}. Pass a channel name, a file or "
        "directory (.jsonl, .json, .txt, .parquet, .arrow, .npy, .bin/.idx), a datasets.Dataset "
        "or a map-style dataset of token sequences.")


def _open_location(path: Path, options: SourceOptions) -> SourceData:
    files = data_files(path)
    identity = {"files": {_relative(f, path): file_digest(f) for f in files + _indexes(files)}}
    suffixes = {f.suffix for f in files}
    if suffixes <= set(formats.TEXT_SUFFIXES):
        records: list[Any] = []
        for file in files:
            records.extend(_file_records(file, options.text_field))
        return _from_records(records, identity, options, str(path))
    if suffixes == {".npy"}:
        return _from_npy([formats.read_npy(f) for f in files], identity, options, str(path))
    if suffixes == {".bin"}:
        streams = [formats.read_megatron(f) for f in files]
        stream = streams[0] if len(streams) == 1 else ChainStream(streams)
        samples = PackedSamples(stream, window_of(options.seq_len, "a Megatron .bin/.idx dataset"))
        return _finish(samples, identity, options, None, str(path), packing="packed")
    raise ConfigError(
        f"{path} mixes text files and token files ({', '.join(sorted(suffixes))}). A loader reads "
        "one kind: text (.jsonl, .json, .txt, .parquet, .arrow) or token ids (.npy, or .bin/.idx).")


def data_files(path: Path) -> list[Path]:
    """`path` itself, or the data files under it (sorted; hidden and ``_*`` names skipped, and
    the metadata ``datasets``' save_to_disk writes beside its .arrow files)."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file()
                       and not any(part.startswith((".", "_")) for part in
                                   p.relative_to(path).parts))
    saved = {f.parent for f in files if f.suffix == ".arrow"}  # datasets' save_to_disk folders
    usable = [f for f in files if f.suffix in formats.TEXT_SUFFIXES + formats.TOKEN_SUFFIXES
              and not (f.parent in saved and f.name in formats.DATASETS_METADATA)]
    if not usable:
        seen = ", ".join(f.name for f in files[:5]) or "nothing"
        raise ConfigError(
            f"{path}: no data file to read (found {seen}). The loader reads .jsonl, .json, .txt, "
            ".parquet, .arrow (text), .npy and Megatron .bin/.idx (token ids).")
    return usable


def file_digest(path: Path) -> dict[str, Any]:
    """Size and sha256 of the first and last 64 KiB (the whole file when it is smaller)."""
    size = path.stat().st_size
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        sha.update(handle.read(DIGEST_BYTES))
        if size > DIGEST_BYTES:
            handle.seek(max(DIGEST_BYTES, size - DIGEST_BYTES))
            sha.update(handle.read())
    return {"bytes": size, "sha256": sha.hexdigest()[:16]}


def _indexes(files: list[Path]) -> list[Path]:
    return [f.with_suffix(".idx") for f in files
            if f.suffix == ".bin" and f.with_suffix(".idx").is_file()]


def _relative(file: Path, root: Path) -> str:
    return file.name if root.is_file() else file.relative_to(root).as_posix()


def _file_records(file: Path, text_field: str) -> list[Any]:
    if file.suffix == ".txt":
        return [file.read_text(encoding="utf-8")]
    if file.suffix in (".parquet", ".arrow"):
        return formats.read_table_records(file, text_field)
    return formats.read_json_records(file, text_field)


def _from_records(records: list[Any], identity: dict[str, Any], options: SourceOptions,
                  where: str) -> SourceData:
    """Texts -> tokenized and packed with EOS; token arrays -> rows or packed as they are."""
    texts = [r for r in records if isinstance(r, str)]
    if texts and len(texts) == len(records):
        tokenizer = resolve_tokenizer(options.tokenizer)
        stream = pack_documents(tokenizer.encode(texts), eos=tokenizer.eos_token_id,
                                vocab_size=tokenizer.vocab_size)
        samples = PackedSamples(stream, window_of(options.seq_len, f"text ({where})"))
        return _finish(samples, identity, options, tokenizer, where, packing="packed with EOS")
    if texts or not records:
        what = "no records" if not records else "both text and token ids"
        raise ConfigError(f"{where} holds {what}. Give the loader documents of one kind: texts in "
                          f"{options.text_field!r} or token ids in 'input_ids'.")
    return _from_token_documents([np.asarray(r) for r in records], identity, options, where)


def _from_token_documents(documents: list[np.ndarray], identity: dict[str, Any],
                          options: SourceOptions, where: str) -> SourceData:
    lengths = {len(d) for d in documents}
    width = next(iter(lengths)) if len(lengths) == 1 else None
    if width is not None and (options.seq_len is None or width == options.seq_len + 1):
        rows = ArrayRows([np.stack(documents)])
        return _finish(RowSamples(rows, rows.num_rows, width), identity, options, None, where,
                       packing="rows")
    vocab = int(max(int(d.max()) for d in documents if len(d)) + 1)
    stream = pack_documents(documents, eos=None, vocab_size=vocab)
    samples = PackedSamples(stream, window_of(options.seq_len, f"token sequences ({where})"))
    return _finish(samples, identity, options, None, where, packing="packed")


def _from_npy(arrays: list[np.ndarray], identity: dict[str, Any], options: SourceOptions,
              where: str) -> SourceData:
    dims = {a.ndim for a in arrays}
    if dims == {2}:
        widths = {a.shape[1] for a in arrays}
        width = widths.pop() if len(widths) == 1 else None
        if width is None or (options.seq_len is not None and width != options.seq_len + 1):
            raise ConfigError(
                f"{where}: a 2-D .npy holds samples of seq_len + 1 tokens (inputs = row[:-1], "
                f"targets = row[1:]); its rows have {sorted({a.shape[1] for a in arrays})} tokens "
                f"but seq_len={options.seq_len} needs {(options.seq_len or 0) + 1}. Pass "
                "seq_len=<row length - 1> or re-cut the array.")
        rows = ArrayRows(arrays)
        return _finish(RowSamples(rows, rows.num_rows, width), identity, options, None, where,
                       packing="rows")
    if dims == {1}:
        streams = [ArrayStream(a) for a in arrays]
        stream = streams[0] if len(streams) == 1 else ChainStream(streams)
        samples = PackedSamples(stream, window_of(options.seq_len, f"a 1-D .npy ({where})"))
        return _finish(samples, identity, options, None, where, packing="packed")
    raise ConfigError(f"{where} mixes 1-D and 2-D .npy files; use one kind.")


def _open_token_dataset(dataset: Any, options: SourceOptions) -> SourceData:
    items = DatasetItems(dataset)
    count = len(dataset)
    if count == 0:
        raise ConfigError("loader(): the dataset is empty.")
    lengths = np.fromiter((len(items(i)) for i in range(count)), dtype=np.int64, count=count)
    first, last = items(0), items(count - 1)
    identity = {"dataset": type(dataset).__name__, "rows": count,
                "sha256": _rows_digest([first, last])}
    width = int(lengths[0]) if (lengths == lengths[0]).all() else None
    where = f"the {type(dataset).__name__}"
    if width is not None and (options.seq_len is None or width == options.seq_len + 1):
        return _finish(RowSamples(items, count, width), identity, options, None, where,
                       packing="rows")
    samples = PackedSamples(DocStream(items, lengths),
                            window_of(options.seq_len, f"token sequences ({where})"))
    return _finish(samples, identity, options, None, where, packing="packed")


class DatasetItems:
    """Item i of a map-style dataset as a 1-D token array (picklable, for workers)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, index: int) -> np.ndarray:
        item = self.dataset[index]
        if isinstance(item, dict):
            item = item.get(formats.TOKEN_COLUMN, item)
        elif isinstance(item, tuple) and len(item) == 1:  # a TensorDataset of token ids
            item = item[0]
        if hasattr(item, "numpy"):
            item = item.detach().cpu().numpy() if hasattr(item, "detach") else item.numpy()
        array = np.asarray(item)
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise ConfigError(f"item {index} of the dataset is not a 1-D sequence of token ids "
                              f"({array.ndim}-D {array.dtype}). A map-style dataset gives the "
                              "loader token ids (a tensor, array or list, (tensor,) or "
                              "{'input_ids': ...}).")
        return array


def _finish(samples: PackedSamples | RowSamples, identity: dict[str, Any],
            options: SourceOptions, tokenizer: Any, where: str, *, packing: str) -> SourceData:
    if samples.num_samples == 0:
        raise ConfigError(f"{where} holds fewer tokens than one sample of seq_len + 1 = "
                          f"{samples.window}. Give more data or a shorter seq_len.")
    fingerprint = {"source": identity,
                   "tokenizer": tokenizer.fingerprint if tokenizer is not None else None,
                   "seq_len": samples.window - 1, "packing": packing,
                   "text_field": options.text_field if tokenizer is not None else None,
                   "samples": samples.num_samples}
    return SourceData(samples, fingerprint,
                      tokenizer.vocab_size if tokenizer is not None else None,
                      tokenizer.eos_token_id if tokenizer is not None else None,
                      f"{where}: {samples.num_samples} samples of {samples.window} tokens "
                      f"({packing})")


def _is_hf_dataset(source: Any) -> bool:
    return type(source).__module__.startswith("datasets.") and hasattr(source, "column_names")


def _rows_digest(rows: list[Any]) -> str:
    """sha256 of the first and last rows (texts or token ids)."""
    sha = hashlib.sha256()
    for row in (rows[0], rows[-1]) if rows else ():
        if isinstance(row, str):
            sha.update(row.encode("utf-8"))
        else:
            sha.update(json.dumps(np.asarray(row).tolist()).encode())
    return sha.hexdigest()[:16]


__all__ = ["SourceData", "SourceOptions", "data_files", "file_digest", "open_source"]
