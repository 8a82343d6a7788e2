"""Delayed parameter initialisation: a meta-device model becomes real one shard at a time.

Call order (inside `transform`): build the model on ``torch.device("meta")`` -> ``fully_shard``
(parameters become meta DTensors holding only this rank's shard shape) -> `materialize_sharded`
(``to_empty`` allocates the local shards only, then HF ``_init_weights`` / ``reset_parameters``
fill them in place). No rank ever allocates a whole parameter.

`load_from_rank0` is the fine-tuning variant: rank 0 holds real weights, every other rank a meta
model; after sharding, each rank receives its shard from rank 0 through
``torch.distributed.checkpoint.state_dict.set_model_state_dict(broadcast_from_rank0=True)``.

Random numbers: on CUDA meshes DTensor's RNG tracker draws each shard from the stream a single
device would use. On CPU meshes torch has no such tracker (``is_rng_supported_mesh`` is False),
so each rank would draw the same numbers for every shard; we seed each rank with a seed agreed
by all ranks plus its ``shard`` and ``tp`` coordinates, so shards differ and replicas agree, and
then copy tensors that are replicated over ``tp`` (norm weights) from the first tp rank. Values
then differ from a single-process init (statistically the same distribution). Expert-parallel
weights are local tensors to DTensor's tracker, so on every device they are drawn under the
agreed seed plus the ``shard`` coordinate (which tells EP ranks and their FSDP shards apart).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.mesh_axes import MeshAxis
from meshtrain_runtime.parallel.expert import expert_parallel_modules
from meshtrain_runtime.torch_api import local_shape_and_offset

InitFn = Callable[[nn.Module], None]


def has_meta_tensors(model: nn.Module) -> bool:
    """True if any parameter or buffer of `model` lives on the meta device."""
    tensors = [*model.parameters(), *model.buffers()]
    return any(t.is_meta for t in tensors)


def materialize_sharded(
    model: nn.Module,
    *,
    device: torch.device,
    buffer_device: torch.device | None = None,
    mesh: DeviceMesh,
    init_weights: InitFn | None = None,
) -> None:
    """Allocate this rank's shards of a sharded meta model on `device` and initialise them.

    `mesh` is the runtime's mesh (or the FSDP mesh): its ``shard`` and ``tp`` axes seed random
    init. `init_weights(module)`, if given, initialises one module's own parameters and buffers
    (SMP's ``init_method_using_config``); otherwise HF ``_init_weights`` or
    ``reset_parameters``, then ``reset_parameters`` of expert-parallel layers (HF's init does not
    know them).
    """
    _check_initialisable(model, init_weights)
    model.to_empty(device=device)
    if buffer_device is not None and buffer_device != device:
        _move_buffers(model, buffer_device)
    cpu = mesh.device_type == "cpu"
    with _sharded_rng(mesh, enabled=cpu), torch.no_grad():
        initialise_weights(model, init_weights)
    if cpu:
        copy_tp_replicated(model, mesh)
    experts = expert_parallel_modules(model) if init_weights is None else []
    if experts:
        with _sharded_rng(mesh, enabled=True, use_tp=False), torch.no_grad():
            for module in experts:
                module.reset_parameters()


def initialise_weights(model: nn.Module, init_weights: InitFn | None = None) -> None:
    """Run the model's own initialisation on (sharded) tensors, module by module."""
    if init_weights is not None:
        for module in model.modules():
            init_weights(module)
        return
    if callable(getattr(model, "initialize_weights", None)) and hasattr(model, "_init_weights"):
        _initialise_hf(model)
        return
    for module in model.modules():
        if _owns_tensors(module) and hasattr(module, "reset_parameters"):
            module.reset_parameters()


def _initialise_hf(model: nn.Module) -> None:
    """HF `initialize_weights` after clearing its done-flags; padding rows zeroed per shard."""
    padded: list[nn.Embedding] = []
    for module in model.modules():
        with contextlib.suppress(AttributeError):
            del module._is_hf_initialized
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            with contextlib.suppress(AttributeError):
                del tensor._is_hf_initialized
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            padded.append(module)
    # HF zeroes `weight[padding_idx]`: on a sharded DTensor that indexing would gather the whole
    # table and write into a copy. Hide the index and zero the row on the shard that holds it.
    saved = [(m, m.padding_idx) for m in padded]
    for module in padded:
        module.padding_idx = None
    try:
        model.initialize_weights()
    finally:
        for module, index in saved:
            module.padding_idx = index
    for module, index in saved:
        zero_row(module.weight, index)


def zero_row(weight: torch.Tensor, row: int) -> None:
    """Zero `weight[row]` in place, touching only the local shard of a DTensor."""
    with torch.no_grad():
        if not isinstance(weight, DTensor):
            weight[row].zero_()
            return
        local = weight.to_local()
        shape, offset = local_shape_and_offset(weight)
        if offset[0] <= row < offset[0] + shape[0]:
            local[row - offset[0]].zero_()


def load_from_rank0(
    model: nn.Module,
    full_state_dict: dict[str, torch.Tensor] | None,
    *,
    device: torch.device,
    buffer_device: torch.device | None = None,
) -> None:
    """Give every rank its shards of rank 0's weights (`full_state_dict`, None on other ranks)."""
    if has_meta_tensors(model):
        model.to_empty(device=device)
        if buffer_device is not None and buffer_device != device:
            _move_buffers(model, buffer_device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state_dict or {}, options=options)
    # Non-persistent buffers (e.g. rotary inv_freq) are not in the state dict.
    for buffer in model.buffers():
        if not isinstance(buffer, DTensor):
            dist.broadcast(buffer, src=0)


def check_rank0_has_weights(model: nn.Module, rank: int, device: torch.device) -> None:
    """Raise ConfigError on every rank (not only rank 0) if rank 0's model is on meta."""
    flag = torch.tensor([1 if rank == 0 and has_meta_tensors(model) else 0], device=device)
    dist.broadcast(flag, src=0)
    if flag.item():
        raise ConfigError(
            "load_state_dict_from_rank0=True, but rank 0's model has parameters on the meta "
            "device. Rank 0 must hold the real weights (e.g. from_pretrained on rank 0, "
            "the meta device on the other ranks)."
        )


def _check_initialisable(model: nn.Module, init_weights: InitFn | None) -> None:
    if init_weights is not None:
        return
    if callable(getattr(model, "initialize_weights", None)) and hasattr(model, "_init_weights"):
        return
    missing = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if _owns_tensors(m) and not hasattr(m, "reset_parameters")
        }
    )
    if missing:
        raise ConfigError(
            f"The meta-device model has modules with their own parameters or buffers but no "
            f"reset_parameters(): {', '.join(missing)}. Give them reset_parameters(), pass "
            "transform(..., init_weights=fn) where fn(module) initialises a module's own "
            "tensors, or build the model on a real device."
        )


def _owns_tensors(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def _move_buffers(model: nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            module._buffers[name] = buffer.to(device)


@contextlib.contextmanager
def _sharded_rng(mesh: DeviceMesh, *, enabled: bool, use_tp: bool = True) -> Iterator[None]:
    """A seed shared by all ranks plus the shard (and tp) coordinate; RNG restored after."""
    if not enabled:
        yield
        return
    seed = torch.randint(0, 2**62, (1,))  # every rank draws, so every rank's stream moves alike
    dist.broadcast(seed, src=0)
    offset = _coordinate(mesh, MeshAxis.SHARD)
    if use_tp:
        offset += _axis_size(mesh, MeshAxis.SHARD) * _coordinate(mesh, MeshAxis.TP)
    devices = [torch.cuda.current_device()] if mesh.device_type == "cuda" else []
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="DTensor random operators")
        torch.manual_seed(int(seed.item()) + 1_000_003 * offset)  # seeds CUDA too
        yield


def _coordinate(mesh: DeviceMesh, axis: MeshAxis) -> int:
    return mesh.get_local_rank(axis) if axis in (mesh.mesh_dim_names or ()) else 0


def _axis_size(mesh: DeviceMesh, axis: MeshAxis) -> int:
    names = mesh.mesh_dim_names or ()
    return mesh.size(names.index(axis)) if axis in names else 1


def copy_tp_replicated(model: nn.Module, mesh: DeviceMesh) -> None:
    """Broadcast, from the first tp rank, the local tensor of every DTensor parameter or buffer
    that is replicated over the ``tp`` axis (tp ranks drew different numbers on CPU)."""
    if _axis_size(mesh, MeshAxis.TP) == 1:
        return
    group = mesh.get_group(MeshAxis.TP)
    source = dist.get_global_rank(group, 0)
    for tensor in [*model.parameters(), *model.buffers()]:
        if not isinstance(tensor, DTensor):
            continue
        names = tensor.device_mesh.mesh_dim_names or ()
        if MeshAxis.TP in names and tensor.placements[names.index(MeshAxis.TP)].is_replicate():
            dist.broadcast(tensor.to_local().detach(), src=source, group=group)


__all__ = [
    "InitFn",
    "check_rank0_has_weights",
    "copy_tp_replicated",
    "has_meta_tensors",
    "initialise_weights",
    "load_from_rank0",
    "materialize_sharded",
    "zero_row",
]
