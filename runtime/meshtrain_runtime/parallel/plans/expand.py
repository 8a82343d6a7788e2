"""Wildcard tensor-parallel plans expanded to the concrete module names of one model.

A plan maps names to styles. Names use Hugging Face's wildcard form: ``*`` stands for one path
component (``layers.*.self_attn.q_proj`` matches ``layers.0.self_attn.q_proj``). Torch's
``parallelize_module`` also accepts wildcards, but expanding them here lets meshtrain reject a
pattern that matches nothing, tell modules from parameters, and find the attention/MLP regions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from meshtrain.contract.errors import ConfigError

StyleSpec = str | ParallelStyle


@dataclass(frozen=True)
class ExpandedPlan:
    """A plan over concrete names: module entries and entries that name a parameter."""

    modules: dict[str, StyleSpec]
    parameters: dict[str, StyleSpec]


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """Compile a wildcard name: ``*`` matches exactly one dotted path component."""
    parts = [re.escape(part) for part in pattern.split("*")]
    return re.compile("[^.]+".join(parts))


def expand_plan(
    model: nn.Module,
    plan: Mapping[str, StyleSpec],
    *,
    prefix: str = "",
    source: str = "tp_plan",
) -> ExpandedPlan:
    """Expand every wildcard entry of `plan` (names relative to `prefix`) over `model`.

    A pattern that matches neither a module nor a parameter is a ConfigError naming `source`
    and showing module names it could have meant.
    """
    module_names = [name for name, _ in model.named_modules() if name]
    param_names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    modules: dict[str, StyleSpec] = {}
    parameters: dict[str, StyleSpec] = {}
    for pattern, style in plan.items():
        regex = pattern_regex(f"{prefix}.{pattern}" if prefix else pattern)
        module_hits = [name for name in module_names if regex.fullmatch(name)]
        param_hits = [name for name in param_names if regex.fullmatch(name)]
        if not module_hits and not param_hits:
            raise ConfigError(
                f"{source} entry {pattern!r} matches no module of {type(model).__name__}"
                f"{f' (under {prefix!r})' if prefix else ''}. Module names look like: "
                f"{_sample_names(module_names)}. Use '*' for the layer index, e.g. "
                f"{_indexed_example(module_names)!r}."
            )
        modules.update(dict.fromkeys(module_hits, style))
        parameters.update(dict.fromkeys(param_hits, style))
    return ExpandedPlan(modules=modules, parameters=parameters)


def module_name(model: nn.Module, target: nn.Module) -> str | None:
    """The qualified name of `target` inside `model` ('' for the model itself)."""
    for name, module in model.named_modules():
        if module is target:
            return name
    return None


def parent_name(name: str) -> str:
    """``a.b.c`` -> ``a.b``; a top-level name -> ''."""
    return name.rpartition(".")[0]


def is_inside(name: str, ancestor: str) -> bool:
    """Whether module `name` is `ancestor` or lies below it."""
    return ancestor == "" or name == ancestor or name.startswith(ancestor + ".")


def _indexed_example(names: list[str]) -> str:
    """The first of the model's own module names with a layer index, as a wildcard."""
    for name in names:
        wildcard = re.sub(r"\.\d+(?=\.|$)", ".*", name)
        if wildcard != name and not wildcard.endswith("*"):
            return wildcard
    return names[-1] if names else "layers.*.proj"


def _sample_names(names: list[str], limit: int = 8) -> str:
    collapsed: list[str] = []
    for name in names:
        wildcard = re.sub(r"\.\d+(?=\.|$)", ".*", name)
        if wildcard not in collapsed:
            collapsed.append(wildcard)
    shown = ", ".join(collapsed[:limit])
    return shown + (", ..." if len(collapsed) > limit else "")
