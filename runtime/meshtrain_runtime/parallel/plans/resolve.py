"""Which modules of a model get which tensor-parallel style: user plans and HF's declared plans.

Style names are those of Hugging Face's plans, so a plan copied from a transformers config works:

===========================  ===============================================================
``colwise``                  split the output features (weight dim 0): q/k/v, gate/up
``rowwise``                  split the input features (weight dim 1): o, down; on an
                             ``nn.Embedding`` it means ``embedding_rowwise``
``embedding_rowwise``        vocab-parallel embedding (weight dim 0 = vocabulary)
``colwise_gather_output``    the LM head: vocab-split logits, gathered unless loss_parallel
``colwise_rep``              alias of ``colwise_gather_output``
``sequence_parallel``        norms on the sequence-split residual stream (with SP only)
``replicate``                keep the module whole on every tp rank
===========================  ===============================================================

A value may also be a torch ``ParallelStyle``, applied as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.plans.expand import (
    ExpandedPlan,
    StyleSpec,
    expand_plan,
    is_inside,
    module_name,
    parent_name,
)
from meshtrain_runtime.parallel.plans.regions import plan_example, whole_input_modules

STYLE_NAMES = (
    "colwise",
    "rowwise",
    "embedding_rowwise",
    "colwise_gather_output",
    "colwise_rep",
    "sequence_parallel",
    "replicate",
)
# HF styles for fused 3-D expert weights and expert dispatch: transformers' own MoE kernels.
# Left out, the experts stay whole on every tp rank, which is correct (only less memory-saving).
KEPT_REPLICATED_STYLES = frozenset(
    {"packed_colwise", "packed_rowwise", "moe_tp_experts", "moe_identity_expert",
     "grouped_gemm", "ep_dispatch_experts", "ep_router"}
)


@dataclass(frozen=True)
class ResolvedPlan:
    """A tensor-parallel plan over one model's concrete module names.

    `regions` are the modules (attention, MLP) whose input enters a colwise -> rowwise pair:
    Megatron's f/g boundaries. `whole_inputs` are modules inside a region that run on its whole
    input (a plain block's norm before its colwise projection; see plans/regions.py).
    `kept_replicated` lists HF entries meshtrain leaves whole.
    """

    styles: dict[str, StyleSpec]
    regions: tuple[str, ...]
    embedding: str | None
    head: str | None
    kept_replicated: tuple[str, ...]
    source: str
    whole_inputs: tuple[str, ...] = ()


def resolve_tp_plan(model: nn.Module, plan: Mapping[str, StyleSpec] | None) -> ResolvedPlan:
    """Resolve the user's `plan`, else the HF model's ``config.base_model_tp_plan``.

    Raises ConfigError when neither exists, or an entry cannot be translated.
    """
    if plan is not None:
        if not plan:
            raise ConfigError(f"tp_plan is empty. Pass module styles, e.g. {plan_example(model)}")
        expanded = expand_plan(model, plan, source="tp_plan")
        if expanded.parameters:
            names = ", ".join(sorted(expanded.parameters)[:3])
            raise ConfigError(
                f"tp_plan names parameters ({names}); meshtrain applies styles to modules. "
                "Name the module that owns the weight (e.g. 'layers.*.mlp.up_proj')."
            )
        return _finish(model, dict(expanded.modules), (), source="tp_plan")
    base_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if not base_plan:
        raise ConfigError(_no_plan_message(model))
    return _resolve_hf_plan(model, dict(base_plan))


def _resolve_hf_plan(model: nn.Module, base_plan: dict[str, str]) -> ResolvedPlan:
    config = model.config  # type: ignore[attr-defined]
    source = f"{type(config).__name__}.base_model_tp_plan"
    base = getattr(model, "base_model", model)
    prefix = module_name(model, base) or ""
    expanded = expand_plan(model, base_plan, prefix=prefix, source=source)
    styles, kept = _drop_kept_replicated(expanded, source)
    embedding = _hf_submodule(model, "get_input_embeddings", nn.Embedding)
    if embedding is not None and embedding not in styles:
        styles[embedding] = "embedding_rowwise"
    head = _hf_submodule(model, "get_output_embeddings", nn.Linear)
    if head is not None and head not in styles:
        styles[head] = "colwise_gather_output"
    return _finish(model, styles, kept, source=source)


def _drop_kept_replicated(
    expanded: ExpandedPlan, source: str
) -> tuple[dict[str, StyleSpec], tuple[str, ...]]:
    kept = [name for name, style in expanded.modules.items() if style in KEPT_REPLICATED_STYLES]
    styles = {
        name: style
        for name, style in expanded.modules.items()
        if not any(is_inside(name, owner) for owner in kept)
    }
    for name in expanded.parameters:
        if not any(is_inside(name, owner) for owner in kept):
            raise ConfigError(
                f"{source} entry for parameter {name!r} has no module-level equivalent in "
                f"meshtrain. Pass tp_plan={{...}} with module names instead."
            )
    return styles, tuple(kept)


def _finish(
    model: nn.Module, styles: dict[str, StyleSpec], kept: tuple[str, ...], *, source: str
) -> ResolvedPlan:
    modules = dict(model.named_modules())
    canonical: dict[str, StyleSpec] = {}
    for name, style in styles.items():
        canonical[name] = _canonical_style(name, style, modules[name], source)
    embedding = _single(canonical, "embedding_rowwise", source)
    head = _single(canonical, "colwise_gather_output", source)
    regions = sorted(
        {parent_name(name) for name, style in canonical.items() if style == "rowwise"}
    )
    if "" in regions:
        raise ConfigError(
            f"{source}: a 'rowwise' module sits directly on the model root; put the colwise -> "
            "rowwise pair inside a submodule (an attention or MLP block)."
        )
    whole_inputs = whole_input_modules(model, canonical, tuple(regions))
    return ResolvedPlan(canonical, tuple(regions), embedding, head, kept, source, whole_inputs)


def _canonical_style(name: str, style: StyleSpec, module: nn.Module, source: str) -> StyleSpec:
    if isinstance(style, ParallelStyle):
        return style
    if style not in STYLE_NAMES:
        raise ConfigError(
            f"{source}[{name!r}] = {style!r} is not a style meshtrain translates. Use one of "
            f"{', '.join(STYLE_NAMES)} or a torch ParallelStyle."
        )
    if style == "colwise_rep":
        return "colwise_gather_output"
    if style == "rowwise" and isinstance(module, nn.Embedding):
        return "embedding_rowwise"
    if style == "embedding_rowwise" and not isinstance(module, nn.Embedding):
        raise ConfigError(
            f"{source}[{name!r}] = 'embedding_rowwise' needs an nn.Embedding, got "
            f"{type(module).__name__}."
        )
    if style in ("colwise", "rowwise", "colwise_gather_output") and not isinstance(
        module, nn.Linear
    ):
        raise ConfigError(
            f"{source}[{name!r}] = {style!r} needs an nn.Linear, got {type(module).__name__}. "
            "Pass a torch ParallelStyle for other module types."
        )
    return style


def _single(styles: dict[str, StyleSpec], wanted: str, source: str) -> str | None:
    names = [name for name, style in styles.items() if style == wanted]
    if len(names) > 1:
        raise ConfigError(
            f"{source} gives {wanted!r} to {len(names)} modules ({', '.join(names)}); a model "
            "has one token embedding and one output head."
        )
    return names[0] if names else None


def _hf_submodule(model: nn.Module, getter: str, kind: type[nn.Module]) -> str | None:
    method = getattr(model, getter, None)
    if not callable(method):
        return None
    try:
        module = method()
    except (NotImplementedError, AttributeError):
        return None
    if not isinstance(module, kind):
        return None
    return module_name(model, module)


def _no_plan_message(model: nn.Module) -> str:
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    shown = ", ".join(linears[:6]) + (", ..." if len(linears) > 6 else "")
    return (
        f"{type(model).__name__} declares no tensor-parallel plan (no "
        "config.base_model_tp_plan), so meshtrain cannot tell which layers to split. Pass one, "
        f"e.g. {plan_example(model)}. Names are module paths with '*' for the layer index (this "
        f"model's linear layers: {shown or 'none'}); styles: {', '.join(STYLE_NAMES)} or a "
        "torch ParallelStyle."
    )
