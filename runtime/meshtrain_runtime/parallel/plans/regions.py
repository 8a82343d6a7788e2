"""Modules inside a tensor-parallel region that see the region's whole input.

A region is the module that holds a rowwise projection (and its colwise partners). In a Hugging
Face layer the region is the attention or MLP submodule and every norm sits outside it. A plain
block often holds everything itself: ``norm -> up -> down`` with ``block`` as the region. Its
norm then lies inside the region, but it runs BEFORE the colwise projection, on the whole
hidden state, so it is replicated like a norm outside regions ("whole-input" modules).

Names cannot tell "before the colwise projection" from "between colwise and rowwise" (where a
rank holds only its slice of the features), so meshtrain accepts norms and modules the plan
styles ``replicate`` there, and checks the data flow at each forward: a whole-input module that
runs after a colwise projection of its region began and before its rowwise output is a
ConfigError naming both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.plans.expand import StyleSpec, is_inside, parent_name


def is_norm(module: nn.Module) -> bool:
    """LayerNorm / RMSNorm-like modules (HF defines its own ``LlamaRMSNorm`` classes)."""
    if isinstance(module, nn.LayerNorm | nn.RMSNorm):
        return True
    return type(module).__name__.endswith("Norm") and any(
        True for _ in module.parameters(recurse=False)
    )


def _is_colwise(style: StyleSpec) -> bool:
    return style == "colwise" or isinstance(style, ColwiseParallel)


def _is_rowwise(style: StyleSpec) -> bool:
    return style == "rowwise" or isinstance(style, RowwiseParallel)


def region_of(name: str, regions: tuple[str, ...]) -> str | None:
    """The innermost region that holds module `name`, else None."""
    holders = [region for region in regions if is_inside(name, region)]
    return max(holders, key=len) if holders else None


def whole_input_modules(
    model: nn.Module, styles: Mapping[str, StyleSpec], regions: tuple[str, ...]
) -> tuple[str, ...]:
    """Modules with parameters inside a region but under no splitting style: norms, and what
    the plan styles 'replicate'. Any other such module is a ConfigError that says what meshtrain
    cannot know and the two ways to fix it."""
    split = [name for name, style in styles.items() if style != "replicate"]
    kept = [name for name, style in styles.items() if style == "replicate"]
    found: list[str] = []
    for name, module in model.named_modules():
        region = region_of(name, regions)
        if region is None or not any(True for _ in module.parameters(recurse=False)):
            continue
        if any(is_inside(name, owner) for owner in split):
            continue  # a style's own parameters
        if is_norm(module) or any(is_inside(name, owner) for owner in kept):
            found.append(name)
            continue
        raise ConfigError(_unstyled_message(name, module, region, styles))
    return tuple(found)


def _unstyled_message(
    name: str, module: nn.Module, region: str, styles: Mapping[str, StyleSpec]
) -> str:
    colwise = [n for n, s in styles.items() if _is_colwise(s) and is_inside(n, region)]
    rowwise = [n for n, s in styles.items() if _is_rowwise(s) and parent_name(n) == region]
    return (
        f"{name} ({type(module).__name__}) has parameters but no tensor-parallel style, and lies "
        f"inside the tensor-parallel region {region} (the module that holds the rowwise "
        f"{', '.join(rowwise) or 'projection'}; colwise: {', '.join(colwise) or 'none'}). "
        "meshtrain cannot tell from the names where it runs: if it runs before the colwise "
        "projections, on the whole hidden state (like a norm), give it 'replicate' in tp_plan; "
        "if it is a projection that takes the region's input, give it 'colwise'; if it runs "
        "between a colwise projection and the rowwise one, each rank holds only its slice of "
        "the features there: give it a splitting style or a torch ParallelStyle."
    )


@dataclass
class _RegionFlow:
    """Where one region's forward is: `split_by` is the colwise projection whose output
    (this rank's slice of the features) is live, None before it and after the rowwise one."""

    region: str
    split_by: str | None = None

    def enter(self, _module: nn.Module, _args: tuple) -> None:
        self.split_by = None

    def split(self, name: str, _module: nn.Module, _args: tuple) -> None:
        self.split_by = name

    def join(self, _module: nn.Module, _args: tuple, _output: object) -> None:
        self.split_by = None

    def check(self, name: str, _module: nn.Module, _args: tuple) -> None:
        if self.split_by is not None:
            raise ConfigError(
                f"{name} runs after the colwise projection {self.split_by} and before the "
                f"rowwise output of its region {self.region}, so each tensor-parallel rank would "
                f"feed it only its own slice of the features; it is kept whole because it is a "
                "norm or styled 'replicate'. Give it a splitting style in tp_plan, or move the "
                "colwise -> rowwise pair into a submodule of its own."
            )


def guard_whole_input_modules(
    model: nn.Module,
    styles: Mapping[str, StyleSpec],
    regions: tuple[str, ...],
    whole_inputs: tuple[str, ...],
) -> None:
    """Hooks that check, at every forward, that each whole-input module runs outside its
    region's colwise -> rowwise span (see the module docstring)."""
    modules = dict(model.named_modules())
    guarded = {region_of(name, regions) for name in whole_inputs}
    for region in sorted(r for r in guarded if r is not None):
        flow = _RegionFlow(region)
        modules[region].register_forward_pre_hook(flow.enter)
        for name, style in styles.items():
            if region_of(name, regions) != region:
                continue
            if _is_colwise(style):
                modules[name].register_forward_pre_hook(partial(flow.split, name))
            elif _is_rowwise(style):
                modules[name].register_forward_hook(flow.join, always_call=True)
        for name in whole_inputs:
            if region_of(name, regions) == region:
                modules[name].register_forward_pre_hook(partial(flow.check, name))


def plan_example(model: nn.Module) -> str:
    """A tp_plan drawn from `model`'s own names: in each module holding two or more linear
    layers, the last one registered is 'rowwise' and the others 'colwise'."""
    children: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if name and isinstance(module, nn.Linear):
            children.setdefault(parent_name(name), []).append(name)
    entries: dict[str, str] = {}
    for parent, names in children.items():
        if parent and len(names) >= 2:
            for name in names:
                entries.setdefault(wildcard(name), "colwise" if name != names[-1] else "rowwise")
    if not entries:
        return ("transform(model, tp_plan={'<block>.<input projection>': 'colwise', "
                "'<block>.<output projection>': 'rowwise'})")
    shown = list(entries.items())[:8]
    body = ", ".join(f"{key!r}: {value!r}" for key, value in shown)
    return "transform(model, tp_plan={" + body + (", ...})" if len(entries) > 8 else "})")


def wildcard(name: str) -> str:
    """``layers.3.up`` -> ``layers.*.up`` (numeric path components become '*')."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.)", "*", name)
