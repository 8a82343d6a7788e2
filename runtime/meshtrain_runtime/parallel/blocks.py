"""Find a model's repeated blocks: the units that FSDP, checkpointing and TP work on.

Order of precedence:
1. an explicit list of modules (or module classes) passed by the caller;
2. Hugging Face models: the classes named in ``_no_split_modules`` (e.g. ``LlamaDecoderLayer``);
3. otherwise the children of every ``nn.ModuleList`` whose children all share one class.

Only the outermost matches are kept: an MoE layer's expert ``ModuleList`` inside a decoder layer
is not a block of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from torch import nn

from meshtrain.contract.errors import ConfigError

BlockSpec = Sequence[nn.Module] | type[nn.Module] | tuple[type[nn.Module], ...]


def find_blocks(model: nn.Module, blocks: BlockSpec | None = None) -> list[nn.Module]:
    """Return `model`'s blocks in module order (outermost matches only; may be empty).

    `blocks` is an explicit list of submodules of `model`, or a class / tuple of classes whose
    instances are the blocks. Without it, HF ``_no_split_modules`` then repeated
    ``nn.ModuleList`` children are used.
    """
    if blocks is not None:
        return _explicit_blocks(model, blocks)
    class_names = _no_split_class_names(model)
    if class_names:
        found = [m for m in model.modules() if type(m).__name__ in class_names and m is not model]
        if found:
            return _outermost(model, found)
    return _outermost(model, _module_list_blocks(model))


def _explicit_blocks(model: nn.Module, blocks: BlockSpec) -> list[nn.Module]:
    if isinstance(blocks, type) or (
        isinstance(blocks, tuple) and blocks and all(isinstance(b, type) for b in blocks)
    ):
        found = [m for m in model.modules() if isinstance(m, blocks) and m is not model]
        if not found:
            raise ConfigError(
                f"blocks={blocks!r}: the model has no submodule of that class. Pass the class of "
                "its repeated layers (e.g. LlamaDecoderLayer) or a list of its submodules."
            )
        return _outermost(model, found)
    members = {id(m) for m in model.modules()}
    chosen = list(blocks)
    for index, module in enumerate(chosen):
        if not isinstance(module, nn.Module) or id(module) not in members or module is model:
            raise ConfigError(
                f"blocks[{index}] ({type(module).__name__}) is not a submodule of the model. "
                "Pass submodules of the model you transform (e.g. list(model.model.layers))."
            )
    if len({id(m) for m in chosen}) != len(chosen):
        raise ConfigError("blocks lists the same module twice; list each block once.")
    return _outermost(model, chosen)


def _no_split_class_names(model: nn.Module) -> set[str]:
    """Union of ``_no_split_modules`` over the model and its HF sub-models."""
    names: set[str] = set()
    for module in model.modules():
        declared = getattr(type(module), "_no_split_modules", None)
        if declared:
            names.update(str(name) for name in declared)
    return names


def _module_list_blocks(model: nn.Module) -> list[nn.Module]:
    found: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) >= 2:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                found.extend(module)
    return found


def _outermost(model: nn.Module, candidates: Iterable[nn.Module]) -> list[nn.Module]:
    """Keep candidates not nested inside another candidate, in `model.modules()` order."""
    chosen = {id(m) for m in candidates}
    result: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if id(module) in chosen:
            result.append(module)
            inside.update(id(sub) for sub in module.modules())
    return result


__all__ = ["BlockSpec", "find_blocks"]
