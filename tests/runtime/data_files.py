"""Data files for the loader's tests, written the way their tools write them.

- `write_jsonl`: text records, one JSON object per line.
- `numbered_rows`: a 2-D .npy of samples whose tokens are their own sample id (row i holds i
  everywhere), so a batch's rows show which samples it holds.
- `write_megatron`: a Megatron indexed dataset (.bin + .idx), byte for byte as Megatron-LM's
  ``IndexedDatasetBuilder`` writes version 1 (header, version, dtype code, sequence and document
  counts, sequence lengths, byte pointers, document indices).
- `word_tokenizer`: a tiny Hugging Face fast tokenizer (word level), built here, nothing
  downloaded.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

MEGATRON_CODES = {np.dtype(np.int32): 4, np.dtype(np.uint16): 8}
INT32 = np.dtype(np.int32)


def write_jsonl(path: Path, texts: Sequence[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: text}) + "\n" for text in texts), encoding="utf-8")
    return path


def story_texts(count: int, seed: int = 0) -> list[str]:
    """`count` short documents of different lengths (deterministic)."""
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "river", "and", "slept"]
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 40)))) + "."
            for _ in range(count)]


def numbered_rows(path: Path, samples: int, width: int) -> Path:
    """A 2-D int32 .npy whose row i is i repeated `width` times."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.repeat(np.arange(samples, dtype=np.int32)[:, None], width, axis=1))
    return path


def write_megatron(prefix: Path, sequences: Sequence[Sequence[int]],
                   dtype: np.dtype = INT32) -> Path:
    """`prefix`.bin and `prefix`.idx holding `sequences` (one document each)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    arrays = [np.asarray(s, dtype=dtype) for s in sequences]
    prefix.with_suffix(".bin").write_bytes(b"".join(a.tobytes() for a in arrays))
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * dtype.itemsize
    documents = np.arange(len(arrays) + 1, dtype=np.int64)
    header = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_CODES[dtype])
    counts = struct.pack("<Q", len(arrays)) + struct.pack("<Q", len(documents))
    prefix.with_suffix(".idx").write_bytes(header + counts + lengths.tobytes()
                                           + pointers.tobytes() + documents.tobytes())
    return prefix.with_suffix(".bin")


def word_tokenizer(words: Sequence[str] = ("the", "cat", "sat", "on", "a", "mat", "dog",
                                           "ran", "to", "river", "and", "slept", ".")):
    """A word-level fast tokenizer with EOS ``</s>`` (id 1) and ``[UNK]`` (id 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]")
