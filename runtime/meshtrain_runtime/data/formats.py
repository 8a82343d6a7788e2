"""Readers of the file formats a loader takes, each a small function of one file.

Text records: ``.jsonl`` (one JSON object per line), ``.json`` (an array of objects, or JSON
lines), ``.txt`` (the whole file is one document), ``.parquet`` / ``.arrow`` (through Hugging
Face ``datasets``, the ``data`` extra). Token ids: ``.npy`` (2-D: samples as they are; 1-D: one
stream) and Megatron's indexed ``.bin`` / ``.idx`` pair (its sequences are the documents).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.data.packing import ArrayStream, DocStream

TEXT_SUFFIXES = (".jsonl", ".json", ".txt", ".parquet", ".arrow")
TOKEN_SUFFIXES = (".npy", ".bin")
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
# Megatron's DType codes (megatron/core/datasets/indexed_dataset.py)
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                   6: np.float64, 7: np.float32, 8: np.uint16}
TOKEN_COLUMN = "input_ids"
DATASETS_METADATA = ("dataset_info.json", "state.json", "dataset_dict.json")


def read_json_records(path: Path, text_field: str) -> list[Any]:
    """The `text_field` of every record of a .jsonl / .json file (or token ids, see below)."""
    text = path.read_text(encoding="utf-8")
    records: list[Any]
    if path.suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError:
            loaded = None  # not one document: JSON lines under a .json name
        if isinstance(loaded, list):
            return [_field(record, text_field, f"{path} item {i}")
                    for i, record in enumerate(loaded)]
        if loaded is not None:
            raise ConfigError(f"{path}: a .json source is an array of records (or one record per "
                              f"line), not a {type(loaded).__name__}. Write [{{\"{text_field}\": "
                              "...}, ...] or JSON lines.")
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{path} line {number} is not JSON ({error.msg}). Each line of "
                                  "a .jsonl file is one JSON object.") from None
            records.append(_field(record, text_field, f"{path} line {number}"))
    return records


def _field(record: Any, text_field: str, where: str) -> Any:
    if isinstance(record, dict) and text_field in record:
        return record[text_field]
    if isinstance(record, dict) and TOKEN_COLUMN in record:
        return np.asarray(record[TOKEN_COLUMN], dtype=np.int64)
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise ConfigError(f"{where} has no field {text_field!r} (it has {keys}). Pass "
                      "loader(..., text_field=<the field that holds the text>).")


def read_table_records(path: Path, text_field: str) -> list[Any]:
    """The `text_field` (or ``input_ids``) column of a .parquet / .arrow file."""
    datasets = import_datasets(f"{path.suffix} files")
    if path.suffix == ".arrow":
        table = datasets.Dataset.from_file(str(path))
    else:
        quiet = datasets.are_progress_bars_disabled()
        datasets.disable_progress_bars()
        try:
            table = datasets.Dataset.from_parquet(str(path), keep_in_memory=True)
        finally:
            if not quiet:
                datasets.enable_progress_bars()
    return dataset_records(table, text_field, str(path))


def dataset_records(table: Any, text_field: str, where: str) -> list[Any]:
    """Texts of column `text_field`, or token arrays of ``input_ids``, of an HF Dataset."""
    columns = list(table.column_names)
    if text_field in columns:
        return list(table[text_field])
    if TOKEN_COLUMN in columns:
        return [np.asarray(row, dtype=np.int64) for row in table[TOKEN_COLUMN]]
    raise ConfigError(f"{where} has no column {text_field!r} (its columns: {columns}). Pass "
                      "loader(..., text_field=<the column that holds the text>), or give token "
                      f"ids in a column {TOKEN_COLUMN!r}.")


def import_datasets(what: str) -> Any:
    try:
        import datasets
    except ImportError as error:
        if getattr(error, "name", None) == "datasets":
            raise ConfigError(f"{what} are read through Hugging Face datasets, which is not "
                              "installed: pip install 'meshtrain[data]'.") from None
        # Installed but broken by one of its own dependencies: pyarrow 26 refuses numpy < 2
        # at import without declaring it (docs/compatibility.md).
        raise ConfigError(f"{what} are read through Hugging Face datasets, which is installed "
                          f"but does not import: {error}. Install versions of its "
                          "dependencies that agree (with numpy < 2: pip install 'pyarrow<26'; "
                          "or pip install 'numpy>=2').") from error
    return datasets


def read_npy(path: Path) -> np.ndarray:
    """A memory-mapped integer array of 1 or 2 dimensions."""
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if array.ndim not in (1, 2) or not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(f"{path}: a .npy source holds token ids, a 1-D (one token stream) or "
                          f"2-D (samples of seq_len + 1 tokens) integer array; this one is "
                          f"{array.ndim}-D {array.dtype}.")
    return array


def read_megatron(bin_path: Path) -> ArrayStream | DocStream:
    """A Megatron indexed dataset (``X.bin`` + ``X.idx``): its sequences as documents."""
    idx_path = bin_path.with_suffix(".idx")
    if not idx_path.is_file():
        raise ConfigError(f"{bin_path} has no {idx_path.name} beside it: a Megatron indexed "
                          "dataset is a .bin and .idx pair of the same name.")
    raw = idx_path.read_bytes()
    header = len(MEGATRON_HEADER)
    if raw[:header] != MEGATRON_HEADER:
        raise ConfigError(f"{idx_path} is not a Megatron index (no MMIDIDX header).")
    version, code, count, _documents = struct.unpack_from("<QBQQ", raw, header)
    if version != 1 or code not in MEGATRON_DTYPES:
        raise ConfigError(f"{idx_path}: index version {version}, dtype code {code}; meshtrain "
                          "reads version 1 with the dtype codes 1-8.")
    offset = header + struct.calcsize("<QBQQ")
    lengths = np.frombuffer(raw, np.int32, count, offset).astype(np.int64)
    pointers = np.frombuffer(raw, np.int64, count, offset + 4 * count)
    dtype = np.dtype(MEGATRON_DTYPES[code])
    tokens = np.memmap(bin_path, dtype=dtype, mode="r")
    starts = pointers // dtype.itemsize
    if np.array_equal(starts, np.concatenate([[0], np.cumsum(lengths)[:-1]])):
        return ArrayStream(tokens[:int(lengths.sum())], starts.astype(np.int64))
    return DocStream(MemmapDocs(tokens, starts, lengths), lengths)


class MemmapDocs:
    """Sequence i of a memory-mapped ``.bin`` at its pointer (picklable, for workers)."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.tokens, self.starts, self.lengths = tokens, starts, lengths

    def __call__(self, index: int) -> np.ndarray:
        start = int(self.starts[index])
        return self.tokens[start:start + int(self.lengths[index])]


__all__ = ["TEXT_SUFFIXES", "TOKEN_SUFFIXES", "dataset_records", "import_datasets",
           "read_json_records", "read_megatron", "read_npy", "read_table_records"]
