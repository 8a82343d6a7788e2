"""Tensor parallelism (Megatron-style column/row splitting) on torch DTensor.

``apply_tensor_parallel`` resolves a plan (the user's, else the HF model's own
``config.base_model_tp_plan``), checks the attention heads against the degree, translates the
plan into torch ``parallelize_module`` styles (see ``plans/styles.py`` for the layout), and
makes every parameter the plan leaves whole a Replicate DTensor, so that a model with tensor
parallelism alone works with ``torch.optim.AdamW`` defaults (foreach refuses a mix of plain
tensors and DTensors). FSDP2's ``fully_shard`` goes on top afterwards (design.md's order).

Nothing is patched onto modules or parameters: torch styles split the weights, and the rest is
forward (pre-)hooks and gradient hooks; what they need to know about a module lives in this
module's weak registries (keyed by module, never by parameter).
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.plans import (
    ResolvedPlan,
    build_parallelize_plan,
    guard_whole_input_modules,
    is_inside,
    resolve_tp_plan,
    sequence_parallel_norms,
)

HEAD_COUNT_ATTRIBUTES = ("num_attention_heads", "num_key_value_heads", "num_heads", "num_kv_heads")

# Bookkeeping kept beside the model, never on it (entries go with their module).
_GLOBAL_HEADS: weakref.WeakKeyDictionary[nn.Module, dict[str, int]] = weakref.WeakKeyDictionary()
_LOCAL_COMPUTE: weakref.WeakKeyDictionary[nn.Module, _LocalParameters] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class TensorParallelInfo:
    """What ``apply_tensor_parallel`` did, kept on the model as ``model.meshtrain_tp``."""

    tp_degree: int
    plan_source: str
    styles: dict[str, str]
    regions: tuple[str, ...]
    replicated_parameters: tuple[str, ...]
    kept_replicated: tuple[str, ...]
    sequence_parallel: bool
    loss_parallel: bool


def apply_tensor_parallel(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    *,
    plan: Mapping[str, str | ParallelStyle] | None = None,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
    random_seed: int | None = None,
) -> nn.Module:
    """Split `model` over the 1-D `tp_mesh` in place and return it.

    plan: wildcard module names -> style ('colwise', 'rowwise', 'embedding_rowwise',
        'colwise_gather_output', 'sequence_parallel', 'replicate' or a torch ParallelStyle);
        None uses the HF model's ``config.base_model_tp_plan`` plus a vocab-parallel embedding
        and LM head.
    sequence_parallel: keep the residual stream split on the sequence dim between regions.
    loss_parallel: leave the logits split on the vocabulary dim (a DTensor); compute the loss
        inside ``torch.distributed.tensor.parallel.loss_parallel()``.
    random_seed: SMP's ``random_seed``; TP-local random ops (inside attention/MLP regions) then
        draw from streams seeded with ``tp_seed(random_seed, tp_rank)``.
    """
    if tp_mesh.ndim != 1:
        raise ValueError(f"tp_mesh must be the 1-D 'tp' axis, got a {tp_mesh.ndim}-D mesh")
    tp_degree = tp_mesh.size()
    resolved = resolve_tp_plan(model, plan)
    check_attention_heads(model, resolved, tp_degree)
    if sequence_parallel:
        check_sequence_parallel(model, resolved)
    tied = _tied_head_weight(model, resolved)
    torch_plan = build_parallelize_plan(
        model, resolved, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel
    )
    parallelize_module(model, tp_mesh, torch_plan)
    guard_whole_input_modules(model, resolved.styles, resolved.regions, resolved.whole_inputs)
    if tied:
        _retie_head(model, resolved)
    set_local_head_counts(model, resolved, tp_degree)
    replicated = replicate_non_tp_parameters(
        model, tp_mesh, regions=resolved.regions, whole_inputs=resolved.whole_inputs
    )
    reduce_partial_gradients(model)
    if random_seed is not None:
        apply_tp_random_seed(model, tp_mesh, random_seed, regions=resolved.regions)
    model.meshtrain_tp = TensorParallelInfo(  # type: ignore[assignment]
        tp_degree=tp_degree,
        plan_source=resolved.source,
        styles={name: str(style) for name, style in torch_plan.items()},
        regions=resolved.regions,
        replicated_parameters=tuple(replicated),
        kept_replicated=resolved.kept_replicated,
        sequence_parallel=sequence_parallel,
        loss_parallel=loss_parallel,
    )
    return model


# --- attention heads ------------------------------------------------------------------------


def attention_head_counts(model: nn.Module, regions: tuple[str, ...]) -> dict[str, int]:
    """Head counts the split must respect: HF config fields and region module attributes."""
    counts: dict[str, int] = {}
    config = getattr(model, "config", None)
    for key in ("num_attention_heads", "num_key_value_heads"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            counts[f"config.{key}"] = value
    modules = dict(model.named_modules())
    for region in regions:
        for attribute in HEAD_COUNT_ATTRIBUTES:
            value = getattr(modules[region], attribute, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                counts.setdefault(f"{_wildcard(region)}.{attribute}", value)
    return counts


def check_attention_heads(model: nn.Module, resolved: ResolvedPlan, tp_degree: int) -> None:
    """Every tp rank must hold whole query and key/value heads; ConfigError otherwise."""
    counts = attention_head_counts(model, resolved.regions)
    bad = {name: n for name, n in counts.items() if n % tp_degree}
    if not bad:
        return
    name, heads = next(iter(bad.items()))
    common = math.gcd(*counts.values())
    valid = [str(d) for d in range(1, common + 1) if common % d == 0]
    choices = ", ".join(valid[:-1]) + " or " + valid[-1] if len(valid) > 1 else "1 (no TP)"
    listing = ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in counts.items())
    raise ConfigError(
        f"tensor_parallel_degree={tp_degree} does not divide {name}={heads}: {heads} / "
        f"{tp_degree} = {heads / tp_degree:g} heads per tp rank, but each rank must hold whole "
        f"attention heads ({listing}). Use tensor_parallel_degree {choices}."
    )


def set_local_head_counts(model: nn.Module, resolved: ResolvedPlan, tp_degree: int) -> None:
    """Divide head-count attributes of the attention regions by the degree.

    HF's LlamaAttention / GPTNeoXAttention (transformers 5.x) reshape with ``view(..., -1,
    head_dim)`` and keep only the q/kv ratio, so they need nothing; modules that reshape with
    ``self.num_heads`` (many custom models) now see their per-rank count. ``config`` stays
    global: it is shared by all layers and saved with checkpoints.
    """
    modules = dict(model.named_modules())
    for region in resolved.regions:
        module = modules[region]
        if module in _GLOBAL_HEADS:  # already divided (a second call on the same model)
            continue
        found = {
            attribute: getattr(module, attribute)
            for attribute in HEAD_COUNT_ATTRIBUTES
            if isinstance(getattr(module, attribute, None), int)
        }
        for attribute, value in found.items():
            setattr(module, attribute, value // tp_degree)
        _GLOBAL_HEADS[module] = found


def global_head_counts(module: nn.Module) -> dict[str, int] | None:
    """The head counts `module` had before `set_local_head_counts` divided them, else None."""
    return _GLOBAL_HEADS.get(module)


# --- sequence parallelism -------------------------------------------------------------------


def check_sequence_parallel(model: nn.Module, resolved: ResolvedPlan) -> None:
    """SP needs the split to start at the embedding and end at the head; nothing else whole
    may touch the (split) residual stream."""
    missing = [
        what
        for what, name in (("token embedding ('embedding_rowwise')", resolved.embedding),
                           ("output head ('colwise_gather_output')", resolved.head))
        if name is None
    ]
    if missing:
        raise ConfigError(
            f"sequence_parallel=True splits the residual stream from the token embedding to the "
            f"output head, but the plan has no {' and no '.join(missing)}. Add them to tp_plan "
            "or set sequence_parallel=False."
        )
    norms = set(sequence_parallel_norms(model, resolved))
    for name in resolved.whole_inputs:
        if name not in norms:
            raise ConfigError(
                f"sequence_parallel=True: {name} runs on the whole input of its region but is "
                "not a norm, so it cannot run on sequence-split tokens. Move it out of the "
                "region's module, or set sequence_parallel=False."
            )
    for name, module in model.named_modules():
        whole = name not in resolved.styles and name not in norms and not any(
            is_inside(name, region) for region in resolved.regions
        )
        if whole and any(True for _ in module.parameters(recurse=False)):
            raise ConfigError(
                f"sequence_parallel=True: {name} ({type(module).__name__}) has parameters but no "
                "tensor-parallel style and sits on the sequence-split residual stream"
                f"{_kept_note(name, resolved)}. Give it a style in tp_plan or set "
                "sequence_parallel=False."
            )


def _kept_note(name: str, resolved: ResolvedPlan) -> str:
    if not resolved.kept_replicated:
        return ""
    return (
        f" (the MoE experts such as {resolved.kept_replicated[0]} use styles of transformers' "
        "own MoE kernels, so meshtrain keeps each MoE block whole on every tp rank; that works "
        "only on the whole, unsplit sequence)"
    )


# --- tied embeddings ------------------------------------------------------------------------


def _tied_head_weight(model: nn.Module, resolved: ResolvedPlan) -> bool:
    if resolved.embedding is None or resolved.head is None:
        return False
    modules = dict(model.named_modules())
    return modules[resolved.embedding].weight is modules[resolved.head].weight


def _retie_head(model: nn.Module, resolved: ResolvedPlan) -> None:
    """Vocab-parallel embedding and head both shard the [vocab, hidden] weight on dim 0, so a
    tied weight stays one parameter: point the head back at the embedding's DTensor."""
    modules = dict(model.named_modules())
    embedding, head = modules[resolved.embedding], modules[resolved.head]  # type: ignore[index]
    if embedding.weight.placements != head.weight.placements:
        raise AssertionError("tied embedding and head must shard the vocabulary the same way")
    head.weight = embedding.weight


# --- parameters the plan leaves whole -------------------------------------------------------


def replicate_non_tp_parameters(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    *,
    regions: tuple[str, ...] = (),
    whole_inputs: tuple[str, ...] = (),
) -> list[str]:
    """Turn every parameter that is still a plain tensor into a Replicate DTensor on `tp_mesh`.

    Fixes the pure-TP trap: AdamW's foreach path fails on a mix of tensors and DTensors.
    The value is broadcast from the first tp rank (``distribute_tensor``), so all tp ranks
    hold the same weights. The owning module still computes on plain local tensors (a pre-hook
    swaps in ``to_local()`` views, which route gradients back to the DTensor), so it works for
    any module, including MoE experts with data-dependent indexing. Parameters inside a
    tensor-parallel region would see only this rank's heads and get a partial gradient: that is
    a ConfigError, except for `whole_inputs` (modules that run on the region's whole input,
    such as a block's norm before its colwise projection). Returns the replicated names.
    """
    replaced: dict[int, nn.Parameter] = {}
    names: list[str] = []
    for module_name, module in model.named_modules():
        own = [(n, p) for n, p in module._parameters.items()
               if p is not None and not isinstance(p, DTensor)]
        if not own:
            continue
        if module_name not in whole_inputs:
            _check_outside_regions(module_name, module, regions)
        for param_name, param in own:
            if id(param) not in replaced:
                value = distribute_tensor(param.detach(), tp_mesh, [Replicate()])
                replaced[id(param)] = nn.Parameter(value, requires_grad=param.requires_grad)
            module.register_parameter(param_name, replaced[id(param)])
            names.append(f"{module_name}.{param_name}" if module_name else param_name)
        _compute_on_local_tensors(module, [param_name for param_name, _ in own])
    return names


def _check_outside_regions(name: str, module: nn.Module, regions: tuple[str, ...]) -> None:
    for region in regions:
        if is_inside(name, region):
            raise ConfigError(
                f"{name} ({type(module).__name__}) lies inside the tensor-parallel region "
                f"{region} and its style left its parameters plain tensors; meshtrain cannot "
                "tell whether it runs on the region's whole input or on this rank's slice of "
                "the features. Give it 'replicate' (whole input, e.g. a norm before the colwise "
                "projection) or a splitting style in tp_plan."
            )


@dataclass
class _LocalParameters:
    """Forward hooks that let a module compute on the local tensors of its Replicate DTensors.

    An instance attribute wins over ``nn.Module.__getattr__`` (which serves ``_parameters``), so
    between the two hooks the forward sees local tensors while named_parameters/state_dict keep
    the DTensors. Only the parameters replicated here: a style's own (sharded) parameters keep
    their DTensor compute.
    """

    names: list[str] = field(default_factory=list)

    def swap_in(self, module: nn.Module, _args: tuple) -> None:
        for name in self.names:
            param = module._parameters.get(name)
            if isinstance(param, DTensor):
                module.__dict__[name] = param.to_local()

    def swap_out(self, module: nn.Module, _args: tuple, _output: Any) -> None:
        for name in self.names:
            module.__dict__.pop(name, None)


def _compute_on_local_tensors(module: nn.Module, names: list[str]) -> None:
    local = _LOCAL_COMPUTE.get(module)
    if local is None:
        local = _LOCAL_COMPUTE[module] = _LocalParameters()
        module.register_forward_pre_hook(local.swap_in)
        module.register_forward_hook(local.swap_out, always_call=True)
    local.names.extend(name for name in names if name not in local.names)


def locally_computed_parameters(module: nn.Module) -> tuple[str, ...]:
    """Names of `module`'s parameters that `replicate_non_tp_parameters` replicated (their
    module computes on local tensors)."""
    local = _LOCAL_COMPUTE.get(module)
    return tuple(local.names) if local is not None else ()


def stop_local_compute(module: nn.Module) -> None:
    """Leave `module`'s forward on its own parameters again (its swap hooks then do nothing);
    for callers that turn the replicated DTensors back into plain tensors."""
    local = _LOCAL_COMPUTE.get(module)
    if local is not None:
        local.names.clear()


def reduce_partial_gradients(model: nn.Module) -> None:
    """Reduce a Partial gradient to its parameter's placement once, right after backward.

    A replicated norm weight applied to sequence-split tokens gets a Partial (per-rank sum)
    gradient. Left so, every optimizer op on it would all-reduce again, and
    ``clip_grad_norm_`` would see a partial; FSDP2 on top reduces it itself (its hook here then
    finds the gradient already reduced). The hook does nothing on a gradient already in its
    parameter's placement, so a second registration (a second call) is harmless; nothing is
    kept about the parameters (a weak reference would stop ``module.to()`` from swapping them).
    """
    for param in model.parameters():
        if isinstance(param, DTensor):
            param.register_post_accumulate_grad_hook(_redistribute_grad)


def _redistribute_grad(param: torch.Tensor) -> None:
    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:  # type: ignore[union-attr]
        param.grad = grad.redistribute(placements=param.placements)  # type: ignore[union-attr]


# --- random seeds ---------------------------------------------------------------------------


def tp_seed(random_seed: int, tp_rank: int) -> int:
    """SMP's ``random_seed`` rule: TP-local random ops use ``random_seed + tp_rank``."""
    return random_seed + tp_rank


def region_seed(random_seed: int, tp_rank: int, region_index: int, forward_index: int) -> int:
    """The seed of one region's forward: ``tp_seed`` mixed with the region and the forward.

    Unique per tp rank, region and forward; the same again when activation checkpointing
    recomputes the region (no forward of the root model happens in between).
    """
    key = f"{tp_seed(random_seed, tp_rank)}:{region_index}:{forward_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


@dataclass
class _ForwardCounter:
    value: int = -1

    def bump(self, _module: nn.Module, _args: tuple) -> None:
        self.value += 1


@dataclass
class _RegionStream:
    """Forward hooks that run one region on its own RNG stream, as ``torch.random.fork_rng``
    would: the pre-hook saves the streams and seeds them, the post-hook (also on an exception)
    restores them."""

    counter: _ForwardCounter
    seed_of: Callable[[int], int]
    saved: list[tuple[torch.Tensor, list[torch.Tensor]]] = field(default_factory=list)

    def enter(self, _module: nn.Module, _args: tuple) -> None:
        devices = _rng_devices()
        self.saved.append(
            (torch.get_rng_state(), [torch.cuda.get_rng_state(device) for device in devices])
        )
        seed = self.seed_of(max(self.counter.value, 0))
        torch.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)

    def exit(self, _module: nn.Module, _args: tuple, _output: Any) -> None:
        cpu_state, cuda_states = self.saved.pop()
        torch.set_rng_state(cpu_state)
        for device, cuda_state in zip(_rng_devices(), cuda_states, strict=True):
            torch.cuda.set_rng_state(cuda_state, device)


def _rng_devices() -> list[int]:
    return [torch.cuda.current_device()] if torch.cuda.is_available() else []


def apply_tp_random_seed(
    model: nn.Module, tp_mesh: DeviceMesh, random_seed: int, *, regions: tuple[str, ...]
) -> None:
    """Run each region's forward on its own RNG stream seeded from ``tp_seed``.

    Random ops inside a region (attention dropout on this rank's heads) then differ across tp
    ranks, as they must; the default stream outside regions is untouched, so ops on the
    replicated residual stream stay identical across tp ranks and equal to the non-TP run with
    the same seed. The region's forward hooks restore the outer stream after each region.
    """
    counter = _ForwardCounter()
    model.register_forward_pre_hook(counter.bump)
    tp_rank = tp_mesh.get_local_rank()
    modules = dict(model.named_modules())
    for index, region in enumerate(regions):
        stream = _RegionStream(counter, partial(region_seed, random_seed, tp_rank, index))
        modules[region].register_forward_pre_hook(stream.enter)
        modules[region].register_forward_hook(stream.exit, always_call=True)


def _wildcard(name: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in name.split("."))


__all__ = [
    "TensorParallelInfo",
    "apply_tensor_parallel",
    "apply_tp_random_seed",
    "attention_head_counts",
    "check_attention_heads",
    "global_head_counts",
    "locally_computed_parameters",
    "reduce_partial_gradients",
    "region_seed",
    "replicate_non_tp_parameters",
    "stop_local_compute",
    "tp_seed",
]
