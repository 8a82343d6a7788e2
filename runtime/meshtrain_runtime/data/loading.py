"""``loader(...)``: one global cursor over a source, the same global batches on every layout.

Each item is this data-parallel rank's rows of one global batch: ``global_batch_size //
dp_size`` samples, as ``(inputs, targets)`` (``inputs = sample[:-1]``, ``targets =
sample[1:]``), plus ``position_ids`` when asked for. Every tensor-, pipeline- and
context-parallel peer of a data-parallel rank gets the same rows (``state.dp_rank`` /
``state.dp_size`` from ``init()``). Global batch k is a pure function of k (``order.py``), so
any number of ranks, hosts or DataLoader workers reads the same batches, and a checkpoint's
position resumes on any layout.

With fault-tolerant replica groups (``meshtrain_runtime.fault``) the loader reads the batch of
the job's step (``fault.step_to_run()``, which also starts the step's quorum and heals a
restarted group), so a step that did not commit is read again, a restarted group starts at the
job's step and every group's loop ends at the job's total. A job resumed from a checkpoint
counts its steps on from the checkpoint's, where the loader restored from the same checkpoint
stands.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.data.order import (
    Cursor,
    advance,
    batches_until,
    epoch_order,
    fingerprint_key,
    locate,
)
from meshtrain_runtime.data.resume import build_state, cursor_from_state
from meshtrain_runtime.data.sources import SourceData, SourceOptions, open_source

Rows = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class LoaderSettings:
    """The loader's keywords, checked."""

    global_batch_size: int
    shuffle: bool = True
    seed: int = 0
    epochs: int = 1
    steps: int | None = None
    num_workers: int = 0
    position_ids: bool = False
    dp_rank: int | None = None
    dp_size: int | None = None

    def __post_init__(self) -> None:
        for name, least in (("global_batch_size", 1), ("seed", 0), ("epochs", 1),
                            ("num_workers", 0)):
            _check_int(name, getattr(self, name), least)
        if self.steps is not None:
            _check_int("steps", self.steps, 1)
        if (self.dp_rank is None) != (self.dp_size is None):
            raise ConfigError("loader(dp_rank=..., dp_size=...) go together: pass both or "
                              "neither (then init()'s state.dp_rank / dp_size are used).")


def _check_int(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"loader({name}={value!r}): {name} is an int >= {least}.")


class RankBatches(Dataset):
    """Global batch k's rows for data-parallel rank `dp_rank` of `dp_size`, by k alone."""

    def __init__(self, data: SourceData, settings: LoaderSettings, cursor: Cursor,
                 dp_rank: int, dp_size: int) -> None:
        self.samples = data.samples
        self.key = fingerprint_key(data.fingerprint)
        self.settings = settings
        self.cursor = cursor
        self.rows = settings.global_batch_size // dp_size
        self.first = dp_rank * self.rows

    def sample_ids(self, batch: int) -> np.ndarray:
        """The sample ids of global batch `batch`, in order (all of them, every rank's)."""
        size = self.settings.global_batch_size
        epoch, offset = locate(self.cursor, batch, size, self.samples.num_samples)
        order = epoch_order(self.samples.num_samples, self.settings.seed, epoch, self.key,
                            self.settings.shuffle)
        return order[offset:offset + size]

    def __getitem__(self, batch: int) -> Rows:
        ids = self.sample_ids(batch)[self.first:self.first + self.rows]
        tokens = np.stack([self.samples.sample(int(i)) for i in ids]).astype(np.int64)
        rows = torch.from_numpy(tokens)
        out: Rows = (rows[:, :-1], rows[:, 1:])
        if self.settings.position_ids:
            positions = np.stack([self.samples.positions(int(i))[:-1] for i in ids])
            out = (*out, torch.from_numpy(positions))
        return out


class Loader:
    """An iterable of this rank's rows of each global batch, with a global, resumable cursor.

    ``len(loader)`` is the number of global batches of the whole run (``steps``, else every
    batch of ``epochs`` passes); iterating reads from the cursor (``loader.step``: batches
    consumed so far, a resumed loader's included) to that end. A batch counts as consumed once
    it is handed out.
    """

    def __init__(self, data: SourceData, settings: LoaderSettings) -> None:
        self.data = data
        self.settings = settings
        self._cursor = Cursor()
        self._consumed = 0
        if self.batches_per_epoch < 1:
            raise ConfigError(
                f"global_batch_size={settings.global_batch_size} is more than the "
                f"{self.num_samples} samples of {data.description.split(':')[0]}, so an epoch "
                "holds no whole batch. Use a smaller global batch, more data or a shorter "
                "seq_len.")

    # --- what the data is ---
    @property
    def num_samples(self) -> int:
        """Samples of seq_len + 1 tokens in one epoch."""
        return self.data.samples.num_samples

    @property
    def seq_len(self) -> int:
        return self.data.samples.window - 1

    @property
    def vocab_size(self) -> int | None:
        """The tokenizer's number of ids (257 for UTF-8 bytes); None for token-id sources."""
        return self.data.vocab_size

    @property
    def eos_token_id(self) -> int | None:
        return self.data.eos_token_id

    @property
    def batches_per_epoch(self) -> int:
        return self.num_samples // self.settings.global_batch_size

    @property
    def step(self) -> int:
        """Global batches consumed: the index of the next batch the loader hands out."""
        return self._consumed

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._position().epoch

    def __len__(self) -> int:
        if self.settings.steps is not None:
            return self.settings.steps
        return batches_until(self._cursor, self.settings.epochs, self.settings.global_batch_size,
                             self.num_samples)

    def __repr__(self) -> str:
        return (f"Loader({self.data.description}; global batch {self.settings.global_batch_size},"
                f" {len(self)} batches, at batch {self.step})")

    # --- reading ---
    def __iter__(self) -> Iterator[Rows]:
        from meshtrain_runtime import fault

        batches = self._rank_batches()
        # current_step() is None without replica groups (fault.session() is not used: the
        # package attribute `session` becomes the submodule once fault tolerance has started)
        if fault.current_step() is not None:
            return self._by_job_step(batches)
        return self._in_order(batches)

    def sample_ids(self, step: int) -> np.ndarray:
        """Global batch `step`'s sample ids, in order (the same on every rank and layout)."""
        return self._batches(0, 1).sample_ids(step)

    def batch(self, step: int) -> Rows:
        """This rank's rows of global batch `step`, without moving the cursor."""
        return self._rank_batches()[step]

    def _in_order(self, batches: RankBatches) -> Iterator[Rows]:
        indices = range(self._consumed, len(self))
        for step, rows in zip(indices, self._fetch(batches, indices), strict=False):
            self._consumed = step + 1
            yield rows

    def _by_job_step(self, batches: RankBatches) -> Iterator[Rows]:
        from meshtrain_runtime import fault

        reader = _JobStepReader(self, batches)
        while True:
            step = fault.step_to_run()  # this step's quorum; a restarted group heals here
            if step >= len(self):
                return
            if step < self._cursor.batch:
                raise ConfigError(
                    f"the job is at step {step}, before the {self._cursor.batch} global batches "
                    "this loader's restored state had consumed. Load the loader from the "
                    "checkpoint the job resumed from: load_checkpoint(path, model, optimizer, "
                    "loader=loader).")
            rows = reader.get(step)
            self._consumed = step + 1
            yield rows

    def _fetch(self, batches: RankBatches, indices: range) -> Iterable[Rows]:
        if self.settings.num_workers == 0:
            return map(batches.__getitem__, indices)
        return DataLoader(batches, batch_size=None, sampler=indices,
                          num_workers=self.settings.num_workers)

    def _rank_batches(self) -> RankBatches:
        return self._batches(*self._coordinates())

    def _batches(self, dp_rank: int, dp_size: int) -> RankBatches:
        return RankBatches(self.data, self.settings, self._cursor, dp_rank, dp_size)

    def _coordinates(self) -> tuple[int, int]:
        rank, size = self.settings.dp_rank, self.settings.dp_size
        if rank is None or size is None:
            rank, size = _runtime_coordinates()
        if not 0 <= rank < size:
            raise ConfigError(f"loader(dp_rank={rank}) must lie in [0, dp_size={size}).")
        batch = self.settings.global_batch_size
        if batch % size:
            suggestion = size * max(1, round(batch / size))
            raise ConfigError(
                f"global_batch_size={batch} does not split evenly over {size} data-parallel "
                f"ranks{_layout_words()}: each rank reads global_batch_size / dp_size rows. "
                f"Use a multiple of {size}, e.g. {suggestion}.")
        return rank, size

    # --- state ---
    def _position(self) -> Cursor:
        return advance(self._cursor, max(self._consumed, self._cursor.batch),
                       self.settings.global_batch_size, self.num_samples)

    def state_dict(self) -> dict[str, Any]:
        """The position, global (the same on every rank): batches consumed, the next batch's
        epoch and sample offset, the global batch size, seed, shuffle and the data's
        fingerprint. JSON-serialisable."""
        return build_state(self._position(), batch_size=self.settings.global_batch_size,
                           seed=self.settings.seed, shuffle=self.settings.shuffle,
                           fingerprint=self.data.fingerprint)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was saved, on any layout: the next batch is the one the
        uninterrupted run reads. Another global batch size continues at the next unread sample.
        A ConfigError names what changed when the data, tokenizer, seq_len, packing, seed or
        shuffle differ from the saved loader's."""
        self._cursor = cursor_from_state(state, seed=self.settings.seed,
                                         shuffle=self.settings.shuffle,
                                         fingerprint=self.data.fingerprint)
        self._consumed = self._cursor.batch


class _JobStepReader:
    """Batches by the job's step: in order through DataLoader workers, restarted at the step
    asked for when it is not the next one (a step read again, a group that rejoined)."""

    def __init__(self, loader: Loader, batches: RankBatches) -> None:
        self.loader, self.batches = loader, batches
        self.iterator: Iterator[Rows] | None = None
        self.next_step = -1

    def get(self, step: int) -> Rows:
        if self.loader.settings.num_workers == 0:
            return self.batches[step]
        if step != self.next_step or self.iterator is None:
            indices = range(step, len(self.loader))
            self.iterator = iter(self.loader._fetch(self.batches, indices))
        self.next_step = step + 1
        return next(self.iterator)


def _runtime_coordinates() -> tuple[int, int]:
    from meshtrain_runtime import state

    if state.is_initialized():
        return state.dp_rank, state.dp_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ConfigError(
            "the loader reads this rank's data-parallel coordinates from meshtrain_runtime.init(),"
            " which has not run in this process of "
            f"{dist.get_world_size()}. Call init() before iterating the loader, or pass "
            "loader(..., dp_rank=..., dp_size=...).")
    return 0, 1


def _layout_words() -> str:
    from meshtrain_runtime import state

    if not state.is_initialized():
        return ""
    st = state.current()
    groups = f" x {st.replica_groups} replica groups" if st.replica_groups > 1 else ""
    return (f" (world {st.world_size}{groups} / (tp {st.tp_size} x pp {st.pp_size} x cp "
            f"{st.cp_size}))")


def loader(source: Any, *, global_batch_size: int, seq_len: int | None = None,
           shuffle: bool = True, seed: int = 0, epochs: int = 1, steps: int | None = None,
           tokenizer: Any = None, text_field: str = "text", num_workers: int = 0,
           position_ids: bool = False, dp_rank: int | None = None,
           dp_size: int | None = None) -> Loader:
    """This data-parallel rank's rows of each global batch of `source` (see the module doc).

    - `source`: a channel name (``"train"`` -> ``/opt/ml/input/data/train``), a local file or
      directory (.jsonl / .json / .txt / .parquet / .arrow text, .npy or Megatron .bin/.idx
      token ids), a ``datasets.Dataset``, or a map-style dataset of token sequences.
    - `global_batch_size`: samples per global batch (every rank's together); each rank reads
      ``global_batch_size // dp_size`` of them.
    - `seq_len`: tokens per sample the model reads (samples hold seq_len + 1); required unless
      the source's samples already have a length (a 2-D .npy, equal-length sequences).
    - `shuffle`, `seed`: the order of each epoch, a pure function of (seed, epoch, the data's
      fingerprint). `epochs` passes, or `steps` global batches if given (then as many epochs
      as it takes).
    - `tokenizer`: a Hugging Face tokenizer or a local tokenizer directory; None = UTF-8 bytes
      (257 ids, EOS 256). `text_field`: the records' field (column) that holds the text.
    - `num_workers`: DataLoader worker processes that prepare batches ahead (the batches do not
      depend on it). `position_ids`: also yield each token's position in its document.
    - `dp_rank`, `dp_size`: read another rank's rows (default: ``init()``'s state; 0 of 1 in a
      single process without init()).
    """
    settings = LoaderSettings(global_batch_size, bool(shuffle), seed, epochs, steps, num_workers,
                              bool(position_ids), dp_rank, dp_size)
    if not isinstance(text_field, str) or not text_field:
        raise ConfigError(f"loader(text_field={text_field!r}): the name of the records' text "
                          "field, e.g. 'text'.")
    data = open_source(source, SourceOptions(seq_len, tokenizer, text_field))
    return Loader(data, settings)


__all__ = ["Loader", "LoaderSettings", "RankBatches", "loader"]
