"""Every private or version-dependent torch API the runtime uses, and the torch releases CI tests.

torch keeps its public API across releases, not its underscore names: torch 2.11's
``DeviceMesh._unflatten`` refused every axis given by name, and ``all_gather_single_autograd``
exists only from torch 2.13. The runtime calls the names here instead of a private torch name
(tests/test_private_torch_api.py fails on a private torch name anywhere else in the runtime).
tests/runtime/test_torch_api.py holds a test per entry, on the installed torch, that fails when
the API's behaviour changes; CI's version tier (.ci/versions.py) runs it on every torch in
`TESTED_TORCH_VERSIONS`. Where a release changed an API, the entry takes a path that works on
the releases before and after the change and says why (a user whose environment holds an older
torch than pyproject's floor gets `untested_torch_message` and as much as still works).

Not listed: ``nn.Module``'s registration dicts (``_parameters``, ``_buffers``, ``_modules``),
which torch documents as the way around ``__setattr__`` and has kept since 1.0.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed import _functional_collectives as _funcol
from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.state_dict_saver import _save_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp._common_utils import clean_tensor_name
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.distributed.fsdp.wrap import _Policy as CustomWrapPolicy
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils._pytree import tree_flatten, tree_map

TESTED_TORCH_VERSIONS: tuple[str, ...] = ("2.13.0", "2.15.0")
"""The torch releases CI runs: the floor pyproject declares (README's pin) and the newest
(.ci/versions.py's environments and README's commands; docs/compatibility.md)."""

AsyncCollectiveTensor = _funcol.AsyncCollectiveTensor
"""A functional collective's pending result (a tensor subclass that waits when first used)."""

flash_attention_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
"""aten's CPU flash attention: (q, k, v, dropout_p, is_causal, *, scale) -> (out, logsumexp)."""
flash_attention_cpu_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
"""Its backward: (grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, *, scale) -> grads."""


# ----------------------------------------------------------------------------- versions
def torch_release(version: str | None = None) -> str:
    """``2.14.1`` for ``2.14.1+cu130``: the release, without the build's local tag."""
    return (version or torch.__version__).split("+")[0]


def untested_torch_message(version: str | None = None) -> str | None:
    """One line for a torch outside `TESTED_TORCH_VERSIONS`, else None."""
    release = torch_release(version)
    if release in TESTED_TORCH_VERSIONS:
        return None
    return (f"meshtrain: torch {release} is not one of the releases meshtrain is tested with "
            f"({', '.join(TESTED_TORCH_VERSIONS)}); see docs/compatibility.md.")


def announce_untested_torch(rank: int) -> None:
    """Print `untested_torch_message` once per job: on global rank 0, to stderr."""
    message = untested_torch_message()
    if message and rank == 0:
        print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- DeviceMesh
def unflatten_mesh(mesh: DeviceMesh, axis: str, sizes: Sequence[int],
                   names: Sequence[str]) -> DeviceMesh:
    """`mesh` with its axis `axis` split into `names` of `sizes` (outermost first): a view of
    the same root mesh, with new process groups for the new axes only.

    ``DeviceMesh._unflatten`` (torch >= 2.10). The axis goes by index: torch 2.11's membership
    test was inverted and refused every axis given by name.
    """
    index = list(mesh.mesh_dim_names or ()).index(axis)
    return mesh._unflatten(index, tuple(sizes), tuple(names))


def flatten_mesh(mesh: DeviceMesh, name: str | None = None) -> DeviceMesh:
    """The 1-D view of all of `mesh`'s axes, named `name` (default: the names joined by '_');
    afterwards the root mesh also answers ``root[name]``. ``DeviceMesh._flatten``."""
    return mesh._flatten(name) if name is not None else mesh._flatten()


# ----------------------------------------------------------------------------- collectives
def wait_collective(tensor: torch.Tensor) -> torch.Tensor:
    """A functional collective's result, waited for (``_functional_collectives.wait_tensor``)."""
    return _funcol.wait_tensor(tensor)


def collective_value(tensor: AsyncCollectiveTensor) -> torch.Tensor:
    """The plain tensor inside a pending functional-collective result, without waiting."""
    return tensor.elem


def all_to_all_single(tensor: torch.Tensor, output_split_sizes: list[int] | None,
                      input_split_sizes: list[int] | None, group: Any) -> torch.Tensor:
    """``_functional_collectives.all_to_all_single`` (no gradient; wait before reading)."""
    return _funcol.all_to_all_single(tensor, output_split_sizes, input_split_sizes, group)


def all_to_all_single_autograd(tensor: torch.Tensor, output_split_sizes: list[int] | None,
                               input_split_sizes: list[int] | None, group: Any) -> torch.Tensor:
    """All-to-all whose backward is the reverse all-to-all (``all_to_all_single_autograd``)."""
    return _funcol.all_to_all_single_autograd(tensor, output_split_sizes, input_split_sizes,
                                              group)


def all_gather_autograd(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's `tensor` concatenated on dim 0, with gradient (the backward reduce-scatters).

    torch 2.13 added ``all_gather_single_autograd`` and deprecated ``all_gather_tensor_autograd``
    (a FutureWarning per call), which is all that torch 2.10-2.12 have.
    """
    gather = getattr(_funcol, "all_gather_single_autograd", None)
    if gather is None:
        gather = _funcol.all_gather_tensor_autograd
    return gather(tensor, 0, group)


# ----------------------------------------------------------------------------- autograd engine
def backward_is_running() -> bool:
    """True inside a backward pass (torch's graph task id is -1 outside one)."""
    return torch._C._current_graph_task_id() != -1


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run `callback` once the current backward pass has finished (call inside a backward)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


# ----------------------------------------------------------------------------- tensors
def dtensor_local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard as stored (not through autograd); other tensors as they are."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def view_base(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor `tensor` is a view of, or `tensor` itself."""
    return tensor._base if tensor._base is not None else tensor


def local_shape_and_offset(tensor: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(this rank's local shape, its offset in the global tensor) of a DTensor."""
    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements)
    return tuple(shape), tuple(offset)


def wrap_compiled_call(module: torch.nn.Module,
                       wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Route `module`'s calls after ``module.compile()`` through ``wrap(compiled call)``."""
    module._compiled_call_impl = wrap(module._compiled_call_impl)


# ----------------------------------------------------------------------------- FSDP2
def fsdp2_unsharded_parameters(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """The unsharded (gathered) parameter tensors of `module`'s own FSDP2 parameter group;
    a freed one has a storage of size 0."""
    group = module._get_fsdp_state()._fsdp_param_group
    for fsdp_param in group.fsdp_params if group is not None else ():
        unsharded = getattr(fsdp_param, "_unsharded_param", None)
        if unsharded is not None:
            yield unsharded


# ----------------------------------------------------------------------------- FSDP1 (SMP compat)
@dataclass(frozen=True)
class FlatParamLayout:
    """How an FSDP1 flat parameter packs its original parameters (index i: the i-th one)."""

    params: Sequence[torch.nn.Parameter]
    shapes: Sequence[torch.Size]
    numels: Sequence[int]
    shard_param_infos: Sequence[Any]
    """Per parameter: ``in_shard``, ``offset_in_shard``, ``numel_in_shard`` on this rank."""
    param_extensions: Sequence[Any]
    """Per parameter: what FSDP1 stripped (the DTensor spec of a tensor-parallel parameter)."""
    numels_with_padding: Sequence[int]
    is_padding_mask: Sequence[bool]


def fsdp1_handle(unit: torch.nn.Module) -> Any | None:
    """An FSDP1 unit's flat-parameter handle (``.flat_param``), None when it manages none."""
    return unit._handle


def fsdp1_uses_orig_params(handle: Any) -> bool:
    """Whether the unit was built with ``use_orig_params=True``."""
    return handle._use_orig_params


def fsdp1_syncs_gradients(root: torch.nn.Module) -> bool:
    """False inside the root's ``no_sync()`` (its gradients were not reduced)."""
    return getattr(root, "_sync_gradients", True)


def flat_param_layout(flat: Any) -> FlatParamLayout:
    """The packing of an FSDP1 flat parameter (``handle.flat_param``)."""
    return FlatParamLayout(
        params=flat._params, shapes=flat._shapes, numels=flat._numels,
        shard_param_infos=flat._shard_param_infos, param_extensions=flat._param_extensions,
        numels_with_padding=flat._numels_with_padding, is_padding_mask=flat._is_padding_mask)


def wrap_policy_module_classes(policy: ModuleWrapPolicy) -> set[type[torch.nn.Module]]:
    """The module classes a ``ModuleWrapPolicy`` wraps."""
    return set(policy._module_classes)


# ----------------------------------------------------------------------------- checkpoints
def save_state_dict_impl(state_dict: dict[str, Any], **kwargs: Any) -> Any:
    """DCP's save without the deprecated wrapper's warning (``state_dict_saver._save_state_dict``;
    keywords: storage_writer, process_group, coordinator_rank, no_dist, planner)."""
    return _save_state_dict(state_dict, **kwargs)


def load_state_dict_impl(state_dict: dict[str, Any], **kwargs: Any) -> Any:
    """DCP's load without the deprecated wrapper's warning (``state_dict_loader._load_state_dict``;
    keywords: storage_reader, process_group, coordinator_rank, no_dist, planner)."""
    return _load_state_dict(state_dict, **kwargs)


__all__ = [
    "TESTED_TORCH_VERSIONS", "AsyncCollectiveTensor", "CustomWrapPolicy", "FlatParamLayout",
    "all_gather_autograd", "all_to_all_single", "all_to_all_single_autograd",
    "announce_untested_torch", "backward_is_running", "clean_tensor_name", "collective_value",
    "dtensor_local", "flash_attention_cpu", "flash_attention_cpu_backward", "flat_param_layout",
    "flatten_mesh", "fsdp1_handle", "fsdp1_syncs_gradients", "fsdp1_uses_orig_params",
    "fsdp2_unsharded_parameters", "load_state_dict_impl", "local_shape_and_offset",
    "queue_backward_callback", "save_state_dict_impl", "torch_release", "tree_flatten",
    "tree_map", "unflatten_mesh", "unflatten_state_dict", "untested_torch_message",
    "view_base", "wait_collective", "wrap_compiled_call", "wrap_policy_module_classes",
]
