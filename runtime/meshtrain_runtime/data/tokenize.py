"""Text to token ids: UTF-8 bytes (nothing to download), or a Hugging Face tokenizer.

The byte tokenizer maps text to its UTF-8 bytes (ids 0-255) and ends each document with EOS =
256 (257 ids in all), so a loader works with nothing but the text. A Hugging Face tokenizer is
used as given (an object) or loaded from a local directory (``AutoTokenizer``, local files
only). Each tokenizer has a fingerprint: what a resume compares to find a changed tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshtrain.contract.errors import ConfigError

BYTE_EOS = 256
BYTE_VOCAB_SIZE = 257
ENCODE_CHUNK = 1024  # documents per call of a Hugging Face tokenizer


@dataclass(frozen=True)
class TextTokenizer:
    """Documents -> token id arrays, with the EOS that ends each packed document."""

    encode: Callable[[Sequence[str]], list[np.ndarray]]
    eos_token_id: int
    vocab_size: int
    fingerprint: dict[str, Any]
    """What identifies it across processes and runs (no paths: a moved copy is the same)."""
    description: str


def byte_tokenizer() -> TextTokenizer:
    """UTF-8 bytes, EOS 256."""
    def encode(texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    return TextTokenizer(encode, BYTE_EOS, BYTE_VOCAB_SIZE,
                         {"kind": "utf-8 bytes", "vocab_size": BYTE_VOCAB_SIZE,
                          "eos_token_id": BYTE_EOS},
                         "UTF-8 bytes (257 ids, EOS 256)")


def resolve_tokenizer(tokenizer: Any) -> TextTokenizer:
    """None -> bytes; a local directory -> AutoTokenizer from it; else an HF tokenizer object."""
    if tokenizer is None:
        return byte_tokenizer()
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = _load_local(Path(tokenizer))
    if not callable(tokenizer) or not hasattr(tokenizer, "eos_token_id"):
        raise ConfigError(
            f"loader(tokenizer=...) takes a Hugging Face tokenizer, a local tokenizer directory or "
            f"None (UTF-8 bytes), got {type(tokenizer).__name__}.")
    return _hf_tokenizer(tokenizer)


def _load_local(directory: Path) -> Any:
    if not directory.is_dir():
        raise ConfigError(f"loader(tokenizer={str(directory)!r}): no such directory. Pass a "
                          "directory a tokenizer was saved to (tokenizer.save_pretrained(path)), "
                          "a tokenizer object, or None for UTF-8 bytes.")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("loader(tokenizer=<directory>) loads it with transformers, which is not "
                          "installed: pip install 'meshtrain[hf]'.") from None
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def _hf_tokenizer(tokenizer: Any) -> TextTokenizer:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError(
            f"the tokenizer {type(tokenizer).__name__} has no eos_token_id, and documents are "
            "packed with EOS between them. Set tokenizer.eos_token (or add one) first.")
    digest = hashlib.sha256(_defining_json(tokenizer).encode()).hexdigest()[:16]

    def encode(texts: Sequence[str]) -> list[np.ndarray]:
        ids: list[np.ndarray] = []
        for start in range(0, len(texts), ENCODE_CHUNK):
            chunk = list(texts[start:start + ENCODE_CHUNK])
            encoded = tokenizer(chunk, add_special_tokens=False)["input_ids"]
            ids.extend(np.asarray(row, dtype=np.int64) for row in encoded)
        return ids

    name = type(tokenizer).__name__
    source = getattr(tokenizer, "name_or_path", "") or ""
    return TextTokenizer(encode, int(eos), len(tokenizer),
                         {"kind": "hugging face", "vocab_size": len(tokenizer),
                          "eos_token_id": int(eos), "sha256": digest},
                         f"{name} {source!r} ({len(tokenizer)} ids, EOS {eos})".replace(" ''", ""))


def _defining_json(tokenizer: Any) -> str:
    """What decides the ids: a fast tokenizer's model, normalizer and pre-tokenizer (merges
    included), else the vocabulary. Not its class or path: the same tokenizer loaded another
    way (an object, a directory, another transformers version's class) is the same."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        return json.dumps({key: spec.get(key) for key in ("model", "normalizer",
                                                          "pre_tokenizer")}, sort_keys=True)
    return json.dumps(sorted(tokenizer.get_vocab().items()))


def describe_fingerprint(fingerprint: dict[str, Any] | None) -> str:
    """A tokenizer fingerprint in words, for a resume's error message."""
    if not fingerprint:
        return "none (pre-tokenized data)"
    if fingerprint.get("kind") == "utf-8 bytes":
        return "UTF-8 bytes"
    return (f"a Hugging Face tokenizer of {fingerprint.get('vocab_size')} ids, EOS "
            f"{fingerprint.get('eos_token_id')}, sha256 {fingerprint.get('sha256')}")


__all__ = ["BYTE_EOS", "BYTE_VOCAB_SIZE", "TextTokenizer", "byte_tokenizer",
           "describe_fingerprint", "resolve_tokenizer"]
