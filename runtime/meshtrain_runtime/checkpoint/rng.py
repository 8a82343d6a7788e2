"""Each rank's random number generator states, saved beside a checkpoint and restored on resume.

Dropout masks, data shuffles and random initialisations differ per rank, so each rank keeps its
own file (``<checkpoint>/rng/rank_00003.pt``). They are restored only when the resuming job has
the same world size: on another layout rank r is not the same worker, and its old stream would
be a misleading copy (the data order comes from the loader's saved position there, or the step
in ``extra``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

RNG_DIR = "rng"


def rng_file(checkpoint: Path, rank: int) -> Path:
    return checkpoint / RNG_DIR / f"rank_{rank:05d}.pt"


def capture_rng_states() -> dict[str, Any]:
    """torch's CPU generator, every CUDA generator in use, and Python's `random`."""
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def save_rng_states(checkpoint: Path, rank: int) -> None:
    target = rng_file(checkpoint, rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(capture_rng_states(), target)


def restore_rng_states(checkpoint: Path, rank: int) -> bool:
    """Restore this rank's saved states; False when the checkpoint has none for it."""
    source = rng_file(checkpoint, rank)
    if not source.is_file():
        return False
    states = torch.load(source, weights_only=True)
    torch.set_rng_state(states["torch"])
    random.setstate(_as_tuple(states["python"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    return True


def _as_tuple(value: Any) -> Any:
    """random.setstate wants the nested tuples getstate made (a round trip may give lists)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value
