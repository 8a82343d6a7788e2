"""The runtime's data: ``loader(...)`` reads a source as global batches, one global cursor for
every layout (docs/data.md).

- ``loader`` / ``Loader`` (loading.py, named apart from the function): this data-parallel
  rank's rows of each global batch; the same batches on any dp / tp / pp / cp layout, host
  count or worker count; ``state_dict()``
  that ``save_checkpoint(..., loader=loader)`` stores and any layout resumes from; under
  fault-tolerant replica groups, the rows of the job's step.
- sources.py, formats.py, channels.py: channels, files (.jsonl, .json, .txt, .parquet, .arrow,
  .npy, Megatron .bin/.idx), HF datasets and map-style datasets -> samples and a fingerprint;
  tokenize.py: UTF-8 bytes or a Hugging Face tokenizer; packing.py: documents -> samples of
  seq_len + 1 tokens; order.py: the global order; resume.py: the state and its checks.
- ``build_sampler`` / ``shard_dataset`` (sampler.py): the per-rank helpers for a script's own
  DataLoader (no position kept).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshtrain_runtime.data.loading import Loader, loader
    from meshtrain_runtime.data.sampler import build_sampler, shard_dataset

# loaded on first use: importing the package needs neither numpy (the loader's) nor the samplers
_LAZY = {"Loader": "meshtrain_runtime.data.loading", "loader": "meshtrain_runtime.data.loading",
         "build_sampler": "meshtrain_runtime.data.sampler",
         "shard_dataset": "meshtrain_runtime.data.sampler"}

__all__ = ["Loader", "build_sampler", "loader", "shard_dataset"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
