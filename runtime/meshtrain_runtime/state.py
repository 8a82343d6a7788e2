"""``init()`` and ``state``: ranks, sizes, the named DeviceMesh and process groups of this job.

``init`` resolves the SMP degrees against the real world size and has ``meshtrain_runtime.mesh``
build the job's one world mesh (``pp x replicate x shard x tp``, outermost first, sizes may be
1); the state holds it and its views: ``mesh`` (this stage's dense layers, ``replicate x shard x
tp``, tensor-parallel ranks contiguous), the context-parallel group (carved out of the sharding
group, innermost) and, with expert parallelism, ``expert_mesh`` (``replicate x shard_mod_ep x
ep``, torchtitan's layout). Axis names are ``meshtrain.contract.mesh_axes.MeshAxis``; rank
coordinates are read from the meshes; ``dp_size = world / (pp x tp x cp)``.

This module doubles as the state object: ``meshtrain_runtime.state.rank`` reads the current
``RuntimeState`` through a module ``__getattr__`` (the package attribute ``state`` is this module,
so ``from meshtrain_runtime import state`` works whichever way it was imported).
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshtrain.contract import ResolvedDegrees, SMPParameters, parse_smp_parameters
from meshtrain.contract import resolve_degrees as resolve_contract_degrees
from meshtrain.contract._messages import hosts_and_processes
from meshtrain.contract.distribution import read_parameters_file
from meshtrain.contract.env import SM_HOST_COUNT
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import decode_mp_parameters
from meshtrain.contract.mesh_axes import DENSE_AXES, EXPERT_AXES, MeshAxis, axis_names
from meshtrain.contract.phases import Phase
from meshtrain_runtime import fault
from meshtrain_runtime.host.phases import announce_on_rank_zero
from meshtrain_runtime.mesh import Meshes, build_meshes
from meshtrain_runtime.torch_api import announce_untested_torch

MESH_AXES = axis_names(DENSE_AXES)
EXPERT_MESH_AXES = axis_names(EXPERT_AXES)

ConfigSource = dict[str, Any] | str | os.PathLike | SMPParameters | None


@dataclass(frozen=True)
class RuntimeState:
    """What `init()` resolved for this rank. Read it through ``meshtrain_runtime.state``."""

    config: SMPParameters
    degrees: ResolvedDegrees
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    meshes: Meshes
    world_process_group: dist.ProcessGroup
    tp_process_group: dist.ProcessGroup
    cp_process_group: dist.ProcessGroup
    pp_process_group: dist.ProcessGroup
    ep_process_group: dist.ProcessGroup | None
    rep_rank_process_group: dist.ProcessGroup
    owns_process_group: bool
    replica_group: int = 0
    """Fault tolerance (meshtrain_runtime.fault): this rank's replica group, its own torchrun
    world; 0 without."""
    replica_groups: int = 1
    """Fault tolerance: the job's replica groups (N); 1 without."""

    # --- degrees (SMP names and aliases) ---
    @property
    def hybrid_shard_degree(self) -> int:
        return self.degrees.hybrid_shard_degree

    @property
    def replicate_degree(self) -> int:
        return self.degrees.replicate_degree

    @property
    def tensor_parallel_degree(self) -> int:
        return self.degrees.tensor_parallel_degree

    tp_size = tensor_parallel_degree

    @property
    def expert_parallel_degree(self) -> int:
        return self.degrees.expert_parallel_degree

    ep_size = expert_parallel_degree

    @property
    def context_parallel_degree(self) -> int:
        return self.degrees.context_parallel_degree

    cp_size = context_parallel_degree

    @property
    def pipeline_parallel_degree(self) -> int:
        return self.degrees.pipeline_parallel_degree

    pp_size = pipeline_parallel_degree

    @property
    def sharding_strategy(self) -> str:
        return self.degrees.sharding_strategy

    @property
    def random_seed(self) -> int | None:
        return self.config.random_seed

    # --- meshes: views of the one world mesh (meshtrain_runtime.mesh) ---
    @property
    def mesh(self) -> DeviceMesh:
        """Dense layers' mesh ``(replicate, shard, tp)``."""
        return self.meshes.dense

    @property
    def expert_mesh(self) -> DeviceMesh | None:
        """Expert layers' mesh ``(replicate, shard_mod_ep, ep)``; None without EP."""
        return self.meshes.expert

    @property
    def expert_group_ranks(self) -> dict[str, list[int]] | None:
        """Global ranks of this rank's expert groups; None without EP.

        ``ep``: the ranks tokens are dispatched over (folded over shard x tp with TP);
        ``expert_data_parallel``: the ranks holding the same experts (FSDP of experts,
        ``replicate x shard_mod_ep``); ``token_split``: the tp ranks that share this rank's
        tokens and split them before dispatch (just this rank without TP).
        """
        expert = self.meshes.expert
        if expert is None:
            return None
        data_parallel = (MeshAxis.REPLICATE.value, MeshAxis.SHARD_MOD_EP.value)
        return {
            MeshAxis.EP.value: expert[MeshAxis.EP.value].mesh.flatten().tolist(),
            "expert_data_parallel": sorted(expert[data_parallel].mesh.flatten().tolist()),
            "token_split": self.meshes.dense[MeshAxis.TP.value].mesh.flatten().tolist(),
        }

    @property
    def world_mesh(self) -> DeviceMesh:
        """The one mesh over every rank (1-D ``world``) that the others are views of."""
        return self.meshes.world

    @property
    def dp_mesh(self) -> DeviceMesh:
        """1-D flattened ``replicate x shard``: ranks that see different batches (without CP)."""
        return self.meshes.dp

    # --- coordinates: rank = ((pp_rank * replicate + r) * shard + shard_index) * tp + tp_rank ---
    @property
    def pp_rank(self) -> int:
        """Which pipeline stage (the outermost axis)."""
        return self.meshes.coordinate(MeshAxis.PP)

    @property
    def tp_rank(self) -> int:
        return self.meshes.coordinate(MeshAxis.TP)

    @property
    def shard_rank(self) -> int:
        """Index inside the sharding group (the mesh's ``shard`` coordinate)."""
        return self.meshes.coordinate(MeshAxis.SHARD)

    @property
    def replicate_rank(self) -> int:
        """Which replica (the mesh's ``replicate`` coordinate); SMP's "rep rank"."""
        return self.meshes.coordinate(MeshAxis.REPLICATE)

    @property
    def ep_rank(self) -> int:
        return self.meshes.coordinate(MeshAxis.EP)

    @property
    def cp_rank(self) -> int:
        """Index in the context-parallel group (the innermost part of the sharding group)."""
        return self.meshes.coordinate(MeshAxis.CP)

    @property
    def dp_size(self) -> int:
        """Ranks that see different rows: world / (pp x tp x cp) (cp ranks split one row); with
        fault-tolerant replica groups the whole job's (N x the group's), fixed through failures."""
        return self.degrees.dp_size * self.replica_groups

    @property
    def dp_rank(self) -> int:
        """Which rows this rank reads: its ``replicate x shard`` index // cp (without pp,
        ``rank // (tp x cp)``, as AWS's SMP scripts compute it)."""
        local = self.meshes.coordinate(MeshAxis.DP) // self.cp_size
        return self.replica_group * self.degrees.dp_size + local  # group g's rows come g-th


_current: RuntimeState | None = None
_created_process_group = False  # init() started torch.distributed (kept across reset())
_teardown_registered = False  # the interpreter-exit teardown is registered once per process

# Fields that `__getattr__` forwards to the current RuntimeState.
_STATE_FIELDS = frozenset(
    name for name in dir(RuntimeState) if not name.startswith("_")
) | frozenset(RuntimeState.__dataclass_fields__)


def __getattr__(name: str) -> Any:
    if name in _STATE_FIELDS:
        return getattr(current(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current() -> RuntimeState:
    """The current RuntimeState; raises RuntimeError before `init()`."""
    if _current is None:
        raise RuntimeError(
            "meshtrain_runtime.state is not initialised: call meshtrain_runtime.init() (once per "
            "process, before transform() or reading state)."
        )
    return _current


def is_initialized() -> bool:
    """True after `init()` and before `reset()`."""
    return _current is not None


def reset(*, destroy_process_group: bool = False) -> None:
    """Forget the current state so that `init()` can run again (e.g. with another config).

    The process group is kept unless `destroy_process_group` is True and `init()` created it.
    """
    global _current, _created_process_group
    _current = None
    if destroy_process_group and _created_process_group:
        if dist.is_initialized():
            dist.destroy_process_group()
        _created_process_group = False


def init(config: ConfigSource = None) -> RuntimeState:
    """Initialise the runtime: parse the SMP parameters, start torch.distributed, build the mesh.

    `config` is a dict of SMP parameters, a path to a JSON file of them, or None. Parameters the
    estimator sent (env ``SM_HP_MP_PARAMETERS``) take priority over `config` key by key, as in
    SMP v2; without either, the defaults apply (pure sharded data parallelism over all ranks).
    Works under torchrun and as a single plain process (world size 1). Calling `init` again
    with the same parameters returns the current state; with different ones, call `reset()` first.
    """
    global _current, _created_process_group
    params = load_parameters(config)
    if _current is not None:
        if _current.config == params:
            return _current
        raise ConfigError(
            "meshtrain_runtime.init() was already called with other parameters "
            f"({_current.config.model_dump(exclude_defaults=True)}). Call "
            "meshtrain_runtime.reset() before initialising again."
        )
    device = _select_device()
    _created_process_group = _ensure_process_group(device) or _created_process_group
    announce_untested_torch(dist.get_rank())
    announce_on_rank_zero(Phase.RENDEZVOUS, f"{dist.get_world_size()} ranks joined "
                                            f"({dist.get_backend()})")
    _current = build_state(params, device=device, owns_process_group=_created_process_group)
    ft = fault.start(rank=_current.rank, world_size=_current.world_size,
                     degrees=_current.degrees, device_type=_current.device.type)
    if ft is not None:  # replica groups: this world is one group of the job's
        _current = replace(_current, replica_group=ft.replica_group,
                           replica_groups=ft.replica_groups)
    return _current


def load_parameters(config: ConfigSource) -> SMPParameters:
    """Merge `config` (dict / JSON path / SMPParameters) with ``SM_HP_MP_PARAMETERS`` and parse."""
    if isinstance(config, SMPParameters):
        given = config.model_dump(exclude_defaults=True)
    elif isinstance(config, str | os.PathLike):
        given = read_parameters_file(Path(config), what="init(config=...)")
    elif config is None or isinstance(config, dict):
        given = dict(config or {})
    else:
        raise ConfigError(
            f"init(config=...) takes a dict of SMP parameters or a path to a JSON file, got "
            f"{type(config).__name__}."
        )
    return parse_smp_parameters({**given, **decode_mp_parameters(os.environ)})


def _select_device() -> torch.device:
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _ensure_process_group(device: torch.device) -> bool:
    """Start torch.distributed unless the script already did; return True if we started it."""
    global _teardown_registered
    if dist.is_initialized():
        return False
    # CPU collectives stay available on GPU hosts (object broadcasts, checkpoint metadata).
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # a plain `python train.py`: a world of one process, no rendezvous needed
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    if not _teardown_registered:
        atexit.register(_destroy_own_process_group)
        _teardown_registered = True
    return True


def _destroy_own_process_group() -> None:
    """At interpreter exit: tear down the process group init() started, if the script did not.

    Scripts started without meshtrain's rank entry (plain torchrun, an AWS image's toolkit) end
    with gloo's worker threads still alive, and C++ teardown then aborts a finished rank in a
    fair share of runs ("terminate called without an active exception"; 6 of 12 two-rank runs
    under load, 0 of 20 with this teardown). The state's meshes hold the groups, so they are
    dropped and collected first: destroying the groups while the meshes keep them alive
    aborted as often. No barrier: a rank leaving on an error must not wait for peers still
    training.
    """
    global _current
    if _created_process_group and dist.is_initialized():
        _current = None
        gc.collect()
        try:
            dist.destroy_process_group()
        except Exception as error:  # teardown must not turn a finished run into a crash
            print(f"meshtrain: process group teardown failed: {error}", file=sys.stderr)


def build_state(
    params: SMPParameters,
    *,
    device: torch.device,
    owns_process_group: bool = False,
    degrees: ResolvedDegrees | None = None,
) -> RuntimeState:
    """Resolve degrees against the running process group and build meshes and groups.

    `degrees` skips the resolution (degrees the parameters cannot express yet, e.g. pp > 1).
    """
    world_size, rank = dist.get_world_size(), dist.get_rank()
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if degrees is None:
        degrees = resolve_contract_degrees(
            params,
            world_size,
            ranks_per_host=local_world_size,
            world_description=_describe_world(world_size, local_world_size),
        )
    meshes = build_meshes(degrees, device.type)
    return RuntimeState(
        config=params,
        degrees=degrees,
        rank=rank,
        world_size=world_size,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=local_world_size,
        device=device,
        meshes=meshes,
        world_process_group=dist.group.WORLD,
        tp_process_group=meshes.dense.get_group(MeshAxis.TP.value),
        cp_process_group=meshes.context.get_group(MeshAxis.CP.value),
        pp_process_group=meshes.layout.get_group(MeshAxis.PP.value),
        ep_process_group=(
            meshes.expert.get_group(MeshAxis.EP.value) if meshes.expert is not None else None
        ),
        rep_rank_process_group=(
            dist.group.WORLD if degrees.replicate_degree == 1 else meshes.replica.get_group()
        ),
        owns_process_group=owns_process_group,
    )


def _describe_world(world_size: int, local_world_size: int) -> str:
    hosts = os.environ.get(SM_HOST_COUNT)
    num_hosts = int(hosts) if hosts and hosts.isdigit() else world_size // max(local_world_size, 1)
    if num_hosts * local_world_size != world_size:
        return ""
    return hosts_and_processes(num_hosts, local_world_size)


__all__ = [
    "EXPERT_MESH_AXES",
    "MESH_AXES",
    "RuntimeState",
    "build_state",
    "current",
    "init",
    "is_initialized",
    "load_parameters",
    "reset",
]
