"""meshtrain's planner: memory and communication per GPU, and a ranked layout recommendation.

Pure Python (no torch). Entry points:

- `plan_layouts(model, cluster, training)` -> `Plan` (ranked `LayoutEstimate`s);
- `preflight(distribution, model=..., instance_type=..., instance_count=...)` -> `Plan`, or
  `ConfigError` when the layout cannot fit;
- the per-GPU formulas on their own, for calibration against measurements:
  `model_state_bytes`, `local_param_elements`, `zero_stage_bytes`, `activation_bytes`,
  `communication_volumes`;
- `phase_memory` (meshtrain.plan.phases): what one rank holds in forward, loss, backward and
  the optimizer step; `estimate_layout(...).memory.phases` carries them for a layout;
- `meshtrain.instances` (the instance table) for `ml.*` GPU counts and memory.

The CLI (`meshtrain plan`) lives in `meshtrain.plan.cli`; docs/planner.md explains the
conventions and the JSON schema.
"""

from meshtrain.instances import gpu_memory_gib, gpus_per_instance
from meshtrain.plan.activations import ActivationEstimate, activation_bytes
from meshtrain.plan.cluster import Cluster, build_cluster
from meshtrain.plan.comm import CommVolumes, communication_volumes
from meshtrain.plan.layouts import LayoutEstimate, Plan, estimate_layout, plan_layouts
from meshtrain.plan.memory import (
    ModelStateBytes,
    Training,
    local_param_elements,
    model_state_bytes,
    zero_stage_bytes,
)
from meshtrain.plan.models import PRESETS, ModelSpec, resolve_model
from meshtrain.plan.phases import PHASES, FSDPGroups, PhaseMemory, fsdp_groups, phase_memory
from meshtrain.plan.preflight import preflight

__all__ = [
    "PHASES",
    "PRESETS",
    "ActivationEstimate",
    "Cluster",
    "CommVolumes",
    "FSDPGroups",
    "LayoutEstimate",
    "ModelSpec",
    "ModelStateBytes",
    "PhaseMemory",
    "Plan",
    "Training",
    "activation_bytes",
    "build_cluster",
    "communication_volumes",
    "estimate_layout",
    "fsdp_groups",
    "gpu_memory_gib",
    "gpus_per_instance",
    "local_param_elements",
    "model_state_bytes",
    "phase_memory",
    "plan_layouts",
    "preflight",
    "resolve_model",
    "zero_stage_bytes",
]
