"""Per-rank helpers for a script's own Dataset and DataLoader: shard by the data-parallel
coordinates (``state.dp_rank`` / ``state.dp_size``).

They keep no position: a script that uses them chooses its rows itself and must skip what it
read before a resume (``meshtrain_runtime.data.loader`` keeps one global cursor, resumes on any
layout and follows fault-tolerant steps; prefer it for new scripts).

Tensor-parallel (and context-parallel) ranks of one data-parallel rank must see the same batch,
so data is split over ``dp_size``, never over ``world_size``. Sharding is torch's
``DistributedSampler`` (strided: rank r takes samples r, r + dp_size, ...): with a per-rank
batch of B / dp_size, step k's global batch is exactly samples [k*B, (k+1)*B) of the dataset,
the batch a single process with batch size B would see.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset, DistributedSampler, Subset

from meshtrain.contract.errors import ConfigError


def _dp_coordinates(dp_rank: int | None, dp_size: int | None) -> tuple[int, int]:
    if dp_rank is None or dp_size is None:
        from meshtrain_runtime import state

        dp_rank = state.dp_rank if dp_rank is None else dp_rank
        dp_size = state.dp_size if dp_size is None else dp_size
    if not 0 <= dp_rank < dp_size:
        raise ConfigError(f"dp_rank={dp_rank} must lie in [0, dp_size={dp_size}).")
    return dp_rank, dp_size


def build_sampler(
    dataset: Dataset,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    dp_rank: int | None = None,
    dp_size: int | None = None,
) -> DistributedSampler:
    """A ``DistributedSampler`` over the data-parallel ranks (defaults from the runtime state).

    Call ``sampler.set_epoch(epoch)`` every epoch when shuffling, as with any DistributedSampler.
    """
    rank, size = _dp_coordinates(dp_rank, dp_size)
    return DistributedSampler(
        dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


def shard_dataset(
    dataset: Dataset,
    *,
    dp_rank: int | None = None,
    dp_size: int | None = None,
    drop_last: bool = True,
) -> Subset[Any]:
    """This data-parallel rank's samples (strided, in order) as a ``Subset``.

    With ``drop_last`` (default) every rank gets ``len(dataset) // dp_size`` samples, so all
    ranks run the same number of steps; otherwise the sampler pads by repeating samples.
    """
    sampler = build_sampler(
        dataset, shuffle=False, drop_last=drop_last, dp_rank=dp_rank, dp_size=dp_size
    )
    return Subset(dataset, list(iter(sampler)))


__all__ = ["build_sampler", "shard_dataset"]
