"""SMP's FSDP defaults: the script's FSDP call shards over SMP's hybrid-shard group.

SMP v2 patches FSDP inside ``tsm.init()``; so does this module, reversibly, through the one
table of torch patches in ``_torch_patches`` (public names only, checked signatures):

- FSDP1: when the script passes neither ``process_group`` nor ``device_mesh`` to
  ``FullyShardedDataParallel``, it gets the data-parallel part of the runtime's world mesh: the
  ``shard`` axis (one replica), ``(replicate, shard)`` (hybrid) or ``replicate`` (no sharding),
  or with tensor parallelism the ``shard`` axis of ``(shard, tp)``, whose ``tp`` axis
  ``tsm.transform`` splits weights on. FSDP1 takes a mesh's root for its whole layout (its
  tensor-parallel extension needs the root to be ``(shard, tp)``), so these are root meshes over
  the world mesh's own process groups (``meshtrain_runtime.mesh.root_over_groups``): no second
  process group. The sharding strategy follows H0-H2 (contract §1.2, `resolve_strategy`). SMP's
  extra keyword ``post_param_init_fn`` is run once on the module after wrapping. On a host
  without CUDA ``device_id`` defaults to the CPU device (FSDP1 needs one there).
- FSDP2: ``fully_shard(module)`` without ``mesh`` takes the runtime's data-parallel view.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, StateDictType

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.compat.smp import _fsdp1_ep as fsdp1_ep
from meshtrain_runtime.compat.smp import _fsdp1_tp_optim as tp_optim
from meshtrain_runtime.compat.smp import _torch_patches
from meshtrain_runtime.mesh import root_over_groups
from meshtrain_runtime.parallel.fsdp import data_parallel_mesh

_FULL, _GRAD_OP = ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP
_HYBRID, _HYBRID_ZERO2 = ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2
_NO_SHARD = ShardingStrategy.NO_SHARD


def resolve_strategy(
    requested: ShardingStrategy | None, shard_degree: int, replicate_degree: int
) -> ShardingStrategy:
    """The strategy FSDP1 runs with on SMP's group, from the script's request (None = unset).

    | layout                   | unset / FULL / HYBRID / NO | SHARD_GRAD_OP / _ZERO2 |
    | shard 1 (H1)             | NO_SHARD                   | NO_SHARD               |
    | shard >= 2, 1 replica    | FULL_SHARD                 | SHARD_GRAD_OP          |
    | shard >= 2, replicas (H2)| HYBRID_SHARD               | _HYBRID_SHARD_ZERO2    |

    With one replica a hybrid strategy is the same as full sharding over the shard group.
    """
    if shard_degree == 1:
        return _NO_SHARD
    keeps_params = requested in (_GRAD_OP, _HYBRID_ZERO2)
    if replicate_degree == 1:
        return _GRAD_OP if keeps_params else _FULL
    return _HYBRID_ZERO2 if keeps_params else _HYBRID


@dataclass(frozen=True)
class CompatMeshes:
    """Meshes of SMP's flow: the runtime's world mesh's groups (rank = (rep * shard + s) * tp + t).

    - ``fsdp1``: what FSDP1 gets (None: FSDP1 cannot run this layout, see `fsdp1_refusal`);
    - ``fsdp2``: what ``fully_shard`` without a mesh gets;
    - ``tp``: the axis ``tsm.transform`` splits weights on (None without tensor parallelism).
    """

    fsdp1: DeviceMesh | None
    fsdp2: DeviceMesh
    tp: DeviceMesh | None


def build_compat_meshes(st: runtime_state.RuntimeState) -> CompatMeshes:
    """The meshes of `CompatMeshes`, from the runtime's world mesh (creates no process group)."""
    rep, shard, tp = st.replicate_degree, st.hybrid_shard_degree, st.tp_size
    replicate, shard_axis, tp_axis = MeshAxis.REPLICATE, MeshAxis.SHARD, MeshAxis.TP
    runtime_dp = st.mesh[replicate] if shard == 1 else data_parallel_mesh(st.mesh, rep)
    if fsdp1_ep.uses_ep(st):  # FSDP1 over the expert data-parallel group (see _fsdp1_ep)
        if tp > 1:
            return CompatMeshes(fsdp1=None, fsdp2=runtime_dp, tp=st.mesh[tp_axis])
        shard_axis, shard = MeshAxis.SHARD_MOD_EP, shard // st.expert_parallel_degree
    elif tp > 1:
        if rep > 1:  # FSDP2 only: the runtime's 3-D mesh carries HSDP + TP
            return CompatMeshes(fsdp1=None, fsdp2=runtime_dp, tp=st.mesh[tp_axis])
        root = root_over_groups(st.meshes.submesh(shard_axis, tp_axis))
        return CompatMeshes(fsdp1=root[shard_axis], fsdp2=root[shard_axis], tp=root[tp_axis])
    # H1 (shard 1): no sharding, gradients all-reduced over the replicas; else (replicate, shard)
    axes = (replicate,) if shard == 1 else (shard_axis,) if rep == 1 else (replicate, shard_axis)
    return CompatMeshes(fsdp1=root_over_groups(st.meshes.submesh(*axes)), fsdp2=runtime_dp,
                        tp=None)


def fsdp1_degrees(st: runtime_state.RuntimeState) -> tuple[int, int]:
    """(shard, replicate) degrees of FSDP1's group: with EP the ep axis is left out of it."""
    shard = st.hybrid_shard_degree
    if fsdp1_ep.uses_ep(st):
        shard //= st.expert_parallel_degree
    return shard, st.replicate_degree


def fsdp1_refusal(st: runtime_state.RuntimeState) -> str:
    if fsdp1_ep.uses_ep(st):
        return (
            f"FSDP1 (FullyShardedDataParallel) with expert_parallel_degree="
            f"{st.expert_parallel_degree} and tensor_parallel_degree={st.tp_size} is not "
            "supported (SMP v2 refuses EP with TP too). Use tensor_parallel_degree=1 with "
            "FSDP1, or FSDP2 (fully_shard without a mesh, or meshtrain's transform()) for "
            "TP x EP."
        )
    return (
        f"FSDP1 (FullyShardedDataParallel) with tensor_parallel_degree={st.tp_size} and "
        f"{st.replicate_degree} replicas (hybrid_shard_degree={st.hybrid_shard_degree} < "
        f"{st.world_size} ranks / tp {st.tp_size}) is not supported: torch's FSDP1 + tensor "
        "parallelism recipe has one data-parallel axis, and its sharded checkpoints would be "
        f"mislabelled. Use hybrid_shard_degree={st.world_size // st.tp_size} (0), or FSDP2: "
        "fully_shard(block) / fully_shard(model) without a mesh."
    )


_meshes: CompatMeshes | None = None


def compat_meshes() -> CompatMeshes:
    if _meshes is None:
        raise RuntimeError("SMP's meshes are built by tsm.init(); call it first.")
    return _meshes


_wrapping = [0]  # depth of nested FSDP1 constructors (auto-wrap builds the units inside the root)


def _fsdp1_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: FullyShardedDataParallel, module: torch.nn.Module, *args: Any,
                 **kwargs: Any) -> None:
        post_param_init_fn = kwargs.pop("post_param_init_fn", None)
        ep_root = False
        if _meshes is not None and runtime_state.is_initialized() and not args:
            st = runtime_state.current()
            kwargs = smp_fsdp1_kwargs(st, kwargs)
            ep_root = fsdp1_ep.uses_ep(st) and _wrapping[0] == 0
            if ep_root:
                fsdp1_ep.localise_experts(module)
                kwargs["auto_wrap_policy"] = fsdp1_ep.with_expert_units(
                    kwargs.get("auto_wrap_policy"))
        _wrapping[0] += 1
        try:
            original(self, module, *args, **kwargs)
        finally:
            _wrapping[0] -= 1
        if ep_root:
            fsdp1_ep.install_gradient_finish(self, runtime_state.current())
        if post_param_init_fn is not None:
            post_param_init_fn(self.module)

    __init__._meshtrain_smp_patch = True  # type: ignore[attr-defined]
    return __init__


def smp_fsdp1_kwargs(st: runtime_state.RuntimeState, kwargs: dict[str, Any]) -> dict[str, Any]:
    """FSDP1 keyword arguments with SMP's defaults filled in (the script's own group wins)."""
    kwargs = dict(kwargs)
    if kwargs.get("process_group") is None and kwargs.get("device_mesh") is None:
        mesh = compat_meshes().fsdp1
        if mesh is None:
            raise ConfigError(fsdp1_refusal(st))
        kwargs.pop("process_group", None)
        kwargs["device_mesh"] = mesh
        kwargs["sharding_strategy"] = resolve_strategy(
            kwargs.get("sharding_strategy"), *fsdp1_degrees(st)
        )
    if kwargs.get("device_id") is None and st.device.type == "cpu":
        kwargs["device_id"] = st.device
    return kwargs


def _uses_tp_optim(model: Any, optim_state_dict: Any = None, group: Any = None) -> bool:
    """FSDP1 + TP under SMP with a sharded state-dict type: SMP's optimizer-state format."""
    if _meshes is None or _meshes.tp is None or _meshes.fsdp1 is None:
        return False
    if not isinstance(model, FullyShardedDataParallel) or optim_state_dict is not None or group:
        return False
    settings = FullyShardedDataParallel.get_state_dict_type(model)
    return settings.state_dict_type == StateDictType.SHARDED_STATE_DICT


def _optim_state_dict(original: Callable[..., Any]) -> Callable[..., Any]:
    def optim_state_dict(model: Any, optim: Any, optim_state_dict: Any = None,
                         group: Any = None) -> Any:
        if _uses_tp_optim(model, optim_state_dict, group):
            return tp_optim.optim_state_dict(model, optim, compat_meshes().fsdp1)
        return original(model, optim, optim_state_dict, group)

    return optim_state_dict


def _optim_state_dict_to_load(original: Callable[..., Any]) -> Callable[..., Any]:
    def optim_state_dict_to_load(model: Any, optim: Any, optim_state_dict: Any,
                                 is_named_optimizer: bool = False, load_directly: bool = False,
                                 group: Any = None) -> Any:
        if _uses_tp_optim(model, None, group) and not is_named_optimizer:
            converted = tp_optim.optim_state_dict_to_load(model, optim, optim_state_dict)
            if load_directly:
                optim.load_state_dict(converted)
            return converted
        return original(model, optim, optim_state_dict, is_named_optimizer, load_directly, group)

    return optim_state_dict_to_load


def install_fsdp_defaults() -> None:
    """Take SMP's meshes from the world mesh; patch FSDP1 and FSDP2's default mesh (idempotent)."""
    global _meshes
    _meshes = build_compat_meshes(runtime_state.current())
    _torch_patches.install(
        fsdp1_init=_fsdp1_init,
        optim_state_dict=_optim_state_dict,
        optim_state_dict_to_load=_optim_state_dict_to_load,
        fully_shard_mesh=_meshes.fsdp2,
    )


def remove_fsdp_defaults() -> None:
    """Undo `install_fsdp_defaults` (``tsm.state.reset()``)."""
    global _meshes
    _meshes = None
    _torch_patches.remove()


__all__ = [
    "CompatMeshes",
    "build_compat_meshes",
    "compat_meshes",
    "install_fsdp_defaults",
    "remove_fsdp_defaults",
    "resolve_strategy",
]
