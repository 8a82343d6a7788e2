"""``tsm.state``: SMP v2's state object, read from meshtrain's RuntimeState.

Rank layout (meshtrain's one mesh, ``meshtrain.contract.mesh_axes``; SMP's without pipeline
stages): ``rank = ((pp_rank * replicate + r) * shard + shard_index) * tp + tp_rank``. SMP's
"replication rank" is the replicate coordinate; a replication group holds the ranks of one stage
with the same (shard, tp) coordinates, one per replica. Every group is one of the world mesh's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import state as runtime_state

# SMP parameters a script may assign on ``tsm.state`` before ``tsm.init`` (AWS's example sets
# the degrees to 1 when it runs without SMP's implementation); they act like the init dict.
_ASSIGNABLE = frozenset({
    "tensor_parallel_degree", "expert_parallel_degree", "context_parallel_degree",
    "hybrid_shard_degree",
})


class Ranker:
    """``tsm.state.ranker``: replication ranks and groups of the current layout."""

    def __init__(self, replicate_degree: int, replica_size: int, stages: int = 1) -> None:
        self.replicate_degree = replicate_degree
        self.replica_size = replica_size  # shard x tp ranks: one full copy of one stage
        self.stages = stages  # pipeline stages (outermost)

    def get_rep_rank(self, global_rank: int) -> int:
        """Which replica `global_rank` belongs to (0 .. replicate_degree - 1)."""
        return global_rank // self.replica_size % self.replicate_degree

    def get_rep_groups(self) -> list[list[int]]:
        """Lists of ranks holding the same shard, one rank per replica (for SM_LOCAL saves)."""
        size, replicas = self.replica_size, self.replicate_degree
        return [
            [first + index + replica * size for replica in range(replicas)]
            for first in range(0, self.stages * replicas * size, replicas * size)
            for index in range(size)
        ]


class RNGStateTracker:
    """Minimal ``get_rng_state_tracker()`` object: ``fork()`` runs code on the TP-rank stream.

    The stream is seeded with ``random_seed + tp_rank`` (SMP's rule), so tensor-parallel ranks
    draw different numbers (e.g. dropout on split activations) and every run repeats them.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._forks = 0

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self._forks)
            self._forks += 1
            yield

    def get_states(self) -> dict[str, int]:
        return {"seed": self.seed, "forks": self._forks}

    def set_states(self, states: dict[str, int]) -> None:
        self.seed, self._forks = states["seed"], states["forks"]


class SMPState:
    """SMP v2's ``tsm.state``; every field reads meshtrain's current RuntimeState."""

    def __init__(self) -> None:
        object.__setattr__(self, "_assigned", {})
        object.__setattr__(self, "_initialised", False)
        object.__setattr__(self, "_tracker", None)

    # --- lifecycle ---
    def _initialise(self, config: Any) -> None:
        from meshtrain_runtime.state import load_parameters

        given = _as_dict(config)
        merged = {**self._assigned, **given}  # the init dict wins over assignments
        if self._initialised:
            if runtime_state.current().config == load_parameters(merged):
                return
            raise ConfigError(
                "tsm.init() was already called with other parameters; call tsm.state.reset() "
                "before initialising again."
            )
        if runtime_state.is_initialized():
            runtime_state.reset()
        runtime_state.init(merged)
        object.__setattr__(self, "_initialised", True)

    def _is_initialised(self) -> bool:
        return self._initialised and runtime_state.is_initialized()

    def reset(self) -> None:
        """Forget the layout (the process group stays) and remove the FSDP defaults."""
        from meshtrain_runtime.compat.smp import _fsdp

        _fsdp.remove_fsdp_defaults()
        runtime_state.reset()
        object.__setattr__(self, "_initialised", False)
        object.__setattr__(self, "_assigned", {})
        object.__setattr__(self, "_tracker", None)

    def _rt(self) -> runtime_state.RuntimeState:
        if not self._initialised:
            raise RuntimeError("tsm.state is read before tsm.init(): call tsm.init() first.")
        return runtime_state.current()

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _ASSIGNABLE:
            raise AttributeError(f"tsm.state.{name} cannot be assigned.")
        if self._initialised and getattr(self, name) != value:
            raise ConfigError(
                f"tsm.state.{name} = {value!r} after tsm.init() cannot change the layout "
                f"(it is {getattr(self, name)}). Assign it before tsm.init() or pass it in "
                "the parameters."
            )
        self._assigned[name] = value

    # --- degrees ---
    @property
    def hybrid_shard_degree(self) -> int:
        return self._rt().hybrid_shard_degree

    @property
    def tensor_parallel_degree(self) -> int:
        return self._rt().tensor_parallel_degree

    tp_size = tensor_parallel_degree

    @property
    def expert_parallel_degree(self) -> int:
        return self._rt().expert_parallel_degree

    ep_size = expert_parallel_degree

    @property
    def context_parallel_degree(self) -> int:
        return self._rt().context_parallel_degree

    cp_size = context_parallel_degree

    @property
    def replicate_degree(self) -> int:
        return self._rt().replicate_degree

    # --- ranks ---
    @property
    def rank(self) -> int:
        return self._rt().rank

    @property
    def world_size(self) -> int:
        return self._rt().world_size

    @property
    def local_rank(self) -> int:
        return self._rt().local_rank

    @property
    def tp_rank(self) -> int:
        return self._rt().tp_rank

    @property
    def ep_rank(self) -> int:
        return self._rt().ep_rank

    @property
    def cp_rank(self) -> int:
        return self._rt().cp_rank

    @property
    def dp_rank(self) -> int:
        return self._rt().dp_rank

    @property
    def dp_size(self) -> int:
        return self._rt().dp_size

    # --- process groups ---
    @property
    def world_process_group(self) -> dist.ProcessGroup:
        return self._rt().world_process_group

    @property
    def tp_process_group(self) -> dist.ProcessGroup:
        return self._rt().tp_process_group

    @property
    def ep_process_group(self) -> dist.ProcessGroup | None:
        return self._rt().ep_process_group

    @property
    def cp_process_group(self) -> dist.ProcessGroup:
        """The world mesh's ``cp`` group (this rank alone while context_parallel_degree is 1)."""
        return self._rt().cp_process_group

    @property
    def rep_rank_process_group(self) -> dist.ProcessGroup:
        return self._rt().rep_rank_process_group

    @property
    def ranker(self) -> Ranker:
        st = self._rt()
        return Ranker(st.replicate_degree, st.hybrid_shard_degree * st.tp_size, st.pp_size)

    # --- options ---
    @property
    def sm_activation_offloading(self) -> bool:
        return self._rt().config.sm_activation_offloading

    @property
    def activation_loading_horizon(self) -> int:
        return self._rt().config.activation_loading_horizon

    @property
    def random_seed(self) -> int | None:
        return self._rt().config.random_seed

    @property
    def get_rng_state_tracker(self):  # SMP exposes it as a callable attribute
        st = self._rt()
        if self._tracker is None:
            seed = (st.config.random_seed or 0) + st.tp_rank
            object.__setattr__(self, "_tracker", RNGStateTracker(seed))
        tracker = self._tracker
        return lambda: tracker


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, str | os.PathLike):
        from pathlib import Path

        from meshtrain.contract.distribution import read_parameters_file

        return read_parameters_file(Path(config), what="tsm.init(config=...)")
    raise ConfigError(
        f"tsm.init(config=...) takes a dict of SMP parameters or a path to a JSON file, got "
        f"{type(config).__name__}."
    )


state = SMPState()

__all__ = ["RNGStateTracker", "Ranker", "SMPState", "state"]
