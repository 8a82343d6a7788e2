"""Tensor-parallel plans: HF's declared plans and user plans, translated to torch styles.

Decision (see docs/tensor-parallel.md): meshtrain translates plans into torch's own
``parallelize_module`` styles (ColwiseParallel, RowwiseParallel, SequenceParallel) rather
than calling transformers' ``apply_tensor_parallelism``: torch's styles are a stable public
API shared with FSDP2, while transformers' helpers serve its ``from_pretrained(tp_plan=...)``
loader, are partly deprecated, and need plans expanded per parameter as well as per module.
"""

from meshtrain_runtime.parallel.plans.expand import (
    ExpandedPlan,
    StyleSpec,
    expand_plan,
    is_inside,
    module_name,
    pattern_regex,
)
from meshtrain_runtime.parallel.plans.regions import (
    guard_whole_input_modules,
    is_norm,
    plan_example,
)
from meshtrain_runtime.parallel.plans.resolve import (
    KEPT_REPLICATED_STYLES,
    STYLE_NAMES,
    ResolvedPlan,
    resolve_tp_plan,
)
from meshtrain_runtime.parallel.plans.styles import (
    PrepareRegionInput,
    build_parallelize_plan,
    sequence_parallel_norms,
    torch_style,
)

__all__ = [
    "KEPT_REPLICATED_STYLES",
    "STYLE_NAMES",
    "ExpandedPlan",
    "PrepareRegionInput",
    "ResolvedPlan",
    "StyleSpec",
    "build_parallelize_plan",
    "expand_plan",
    "guard_whole_input_modules",
    "is_inside",
    "is_norm",
    "module_name",
    "pattern_regex",
    "plan_example",
    "resolve_tp_plan",
    "sequence_parallel_norms",
    "torch_style",
]
