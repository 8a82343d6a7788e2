"""Where each context-parallel rank's tokens sit in the global sequence, and the split itself.

Two layouts of a sequence of length S over cp ranks:

- "load_balanced" (SMP v2's, AWS's ``get_batch_for_cp_rank``): S is cut into 2 x cp equal
  chunks and rank r holds chunks r and 2cp-1-r, concatenated. Under a causal mask every rank
  then does the same amount of attention work (an early chunk pairs with a late one).
- "contiguous": S is cut into cp chunks and rank r holds chunk r.

Local tokens are always in increasing global order, which the blockwise attention relies on.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist

from meshtrain.contract.errors import ConfigError

Layout = Literal["load_balanced", "contiguous"]
LAYOUTS = ("load_balanced", "contiguous")


def check_layout(layout: str) -> None:
    """Refuse an unknown layout name."""
    if layout not in LAYOUTS:
        raise ConfigError(
            f"layout={layout!r} is not a context-parallel layout; use one of {LAYOUTS}."
        )


def num_chunks(cp_size: int, layout: str) -> int:
    """How many equal chunks the global sequence is cut into."""
    check_layout(layout)
    return 2 * cp_size if layout == "load_balanced" else cp_size


def chunk_ids(cp_rank: int, cp_size: int, layout: str) -> list[int]:
    """The global chunk indices rank `cp_rank` holds, in the order it holds them."""
    if layout == "load_balanced":
        return [cp_rank, 2 * cp_size - 1 - cp_rank]
    check_layout(layout)
    return [cp_rank]


def check_seq_len(seq_len: int, cp_size: int, layout: str) -> None:
    """Refuse a global sequence length the layout cannot cut into equal chunks."""
    chunks = num_chunks(cp_size, layout)
    if seq_len % chunks:
        why = f"2 x cp = 2 x {cp_size}" if layout == "load_balanced" else f"cp = {cp_size}"
        fit = (seq_len // chunks + 1) * chunks
        raise ConfigError(
            f"sequence length {seq_len} is not divisible by {chunks} ({why} chunks of the "
            f"{layout!r} layout; {seq_len} % {chunks} = {seq_len % chunks}). Pad the sequence "
            f"to a multiple of {chunks} (e.g. {fit}) or change context_parallel_degree."
        )


def local_positions(
    local_seq: int, cp_rank: int, cp_size: int, layout: str, device: torch.device | None = None
) -> torch.Tensor:
    """Global position ids (LongTensor of shape (local_seq,)) of a rank's local tokens."""
    ids = chunk_ids(cp_rank, cp_size, layout)
    if local_seq % len(ids):
        raise ConfigError(
            f"a local sequence of {local_seq} tokens cannot hold {len(ids)} equal chunks of the "
            f"{layout!r} layout ({local_seq} % {len(ids)} = {local_seq % len(ids)})."
        )
    chunk = local_seq // len(ids)
    return torch.cat([torch.arange(i * chunk, (i + 1) * chunk, device=device) for i in ids])


def _check_rank(cp_rank: int, cp_size: int) -> None:
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ConfigError(
            f"cp_rank={cp_rank} is not a rank of a context-parallel group of cp_size={cp_size} "
            f"(it must be 0 <= cp_rank < cp_size)."
        )


def _state_cp_coordinates() -> tuple[int, int]:
    """This process's (cp_rank, cp_size) from the runtime state init() built."""
    from meshtrain_runtime import state  # lazy: the layout math needs no initialised runtime

    current = state.current()
    return current.cp_rank, current.cp_size


def context_parallel_shard(
    *tensors: torch.Tensor, seq_dim: int = 1, cp_rank: int | None = None,
    cp_size: int | None = None, layout: Layout = "load_balanced",
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Split full-sequence tensors into this cp rank's chunks.

    Every tensor must have the same length along `seq_dim` (e.g. input ids (batch, seq),
    labels (batch, seq), hidden states (batch, seq, hidden)). Returns ``(local_tensors,
    positions)``: the local slices (concatenated chunks, in `layout`) and the global position
    ids of the local tokens (LongTensor (local_seq,)), which an HF model takes as
    ``position_ids`` so rotary embeddings see global positions. Raises ConfigError when the
    length is not divisible by 2 x cp_size (load_balanced) or cp_size (contiguous).
    `cp_rank` and `cp_size` default to this process's (``meshtrain_runtime.state``, after
    ``init()``).
    """
    if cp_rank is None or cp_size is None:
        state_rank, state_size = _state_cp_coordinates()
        cp_rank = state_rank if cp_rank is None else cp_rank
        cp_size = state_size if cp_size is None else cp_size
    _check_rank(cp_rank, cp_size)
    if not tensors:
        raise ConfigError("context_parallel_shard needs at least one tensor to split.")
    lengths = {t.shape[seq_dim] for t in tensors}
    if len(lengths) != 1:
        raise ConfigError(
            f"context_parallel_shard got tensors of different lengths {sorted(lengths)} along "
            f"seq_dim={seq_dim}; split tensors of one sequence together."
        )
    (seq_len,) = lengths
    check_seq_len(seq_len, cp_size, layout)
    chunk = seq_len // num_chunks(cp_size, layout)
    ids = chunk_ids(cp_rank, cp_size, layout)
    local = tuple(
        torch.cat([t.narrow(seq_dim, i * chunk, chunk) for i in ids], dim=seq_dim) for t in tensors
    )
    positions = local_positions(chunk * len(ids), cp_rank, cp_size, layout, tensors[0].device)
    return local, positions


def context_parallel_unshard(
    tensor: torch.Tensor, seq_dim: int, group: dist.ProcessGroup, layout: Layout = "load_balanced"
) -> torch.Tensor:
    """All-gather every cp rank's local `tensor` back into the full sequence in global order.

    The inverse of `context_parallel_shard` (not differentiable: for checks and reporting).
    """
    cp_size = dist.get_world_size(group)
    local = tensor.movedim(seq_dim, 0).contiguous()
    gathered = [torch.empty_like(local) for _ in range(cp_size)]
    dist.all_gather(gathered, local, group=group)
    per_chunk = len(chunk_ids(0, cp_size, layout))
    chunk = local.shape[0] // per_chunk
    pieces: dict[int, torch.Tensor] = {}
    for rank, part in enumerate(gathered):
        for slot, index in enumerate(chunk_ids(rank, cp_size, layout)):
            pieces[index] = part[slot * chunk:(slot + 1) * chunk]
    return torch.cat([pieces[i] for i in sorted(pieces)], dim=0).movedim(0, seq_dim)
