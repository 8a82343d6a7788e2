"""Plan a model's pipeline split (checked on every rank before anything changes), then build
this rank's stages once tensor / expert parallelism have changed the model.

`plan_pipeline` runs in ``transform`` right after the model converters: it cuts the block list
into ``pp x stages_per_rank`` stages, decides how each stage runs the model's own code (the
HF path, `hf.py`, or the traced forward, `graph.py`), and refuses what cannot be split, with the
reason and the fix, identically on every rank. `build_pipeline` runs after TP / EP (which
shard or swap modules in place) and returns the `PipelineModule` of this rank's stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.pipeline.graph import GraphStage, StageSpec, plan_graph, stage_specs
from meshtrain_runtime.parallel.pipeline.hf import (
    HFLayout,
    HFStage,
    check_hf_request,
    hf_layout,
    is_hf_model,
    verify_hf_split,
)
from meshtrain_runtime.parallel.pipeline.stages import (
    PipelineModule,
    PipelineStageModule,
    local_stage_indices,
    stage_bounds,
    stage_ranks,
)


@dataclass
class PipelinePlan:
    """How the model is cut: block bounds per stage, and the HF layout or the stage graphs."""

    bounds: list[int]
    layout: HFLayout | None
    specs: list[StageSpec] | None
    constants: dict[str, torch.Tensor]

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1


def plan_pipeline(model: nn.Module, blocks: list[nn.Module], *, params: Any) -> PipelinePlan:
    """Check that `model` can be split into the stages `params` ask for; ConfigError if not."""
    if not blocks:
        raise ConfigError(
            f"pipeline_parallel_degree > 1 but no blocks were found in {type(model).__name__}: "
            "stages are cut between blocks. Pass them: transform(model, blocks=[...]).")
    num_stages = params.pipeline_parallel_degree * params.stages_per_rank
    bounds = stage_bounds(len(blocks), num_stages, params.pipeline_split_points)
    if is_hf_model(model):
        check_hf_request(model)
        layout = hf_layout(model, blocks)
        plan = PipelinePlan(bounds, layout, None, {})
        _check_shared_parameters(model, plan, params)
        verify_hf_split(model, layout, bounds)
        return plan
    graph_plan = plan_graph(model, blocks)
    specs = stage_specs(graph_plan, bounds, type(model).__name__)
    plan = PipelinePlan(bounds, None, specs, graph_plan.traced.constants)
    _check_shared_parameters(model, plan, params)
    return plan


def build_pipeline(model: nn.Module, plan: PipelinePlan, *, params: Any,
                   pp_rank: int) -> PipelineModule:
    """This rank's stages of `model` (as TP / EP left it) under the original names."""
    stages: list[PipelineStageModule] = []
    for index in local_stage_indices(pp_rank, params.pipeline_parallel_degree,
                                     params.stages_per_rank, params.pipeline_schedule):
        blocks = list(range(plan.bounds[index], plan.bounds[index + 1]))
        if plan.layout is not None:
            stages.append(HFStage(model, plan.layout, index, plan.num_stages, blocks))
        else:
            stages.append(_graph_stage(model, plan, index))
    staged = PipelineModule(stages, params)
    config = getattr(model, "config", None)
    if config is not None:  # an HF config (not a module): save_checkpoint keeps config.json
        object.__setattr__(staged, "config", config)
    return staged


def check_pipeline_request(model: nn.Module, load_state_dict_from_rank0: bool) -> None:
    """What pipelining does not take yet: rank-0 weights and meta-device models (every rank
    keeps only its stages, so one rank cannot hand out the others' weights)."""
    if load_state_dict_from_rank0 or any(p.is_meta for p in model.parameters()):
        raise ConfigError(
            "With pipeline_parallel_degree > 1, transform() needs the model's real weights on "
            "every rank (load_state_dict_from_rank0=True or a meta-device model is not "
            "supported with pipelining yet). Build the model with its weights on every rank, or "
            "load a checkpoint after transform().")


def _graph_stage(model: nn.Module, plan: PipelinePlan, index: int) -> GraphStage:
    spec = plan.specs[index]
    stage = GraphStage(spec, plan.num_stages)
    persistent = set(model.state_dict(keep_vars=True))
    for path in spec.module_paths:
        stage.hold_module(path, model.get_submodule(path))
    for path in spec.tensor_paths:
        if path in plan.constants:  # made by the forward while traced: not model state
            stage.hold_tensor(path, plan.constants[path], persistent=False)
        else:
            owner, _, name = path.rpartition(".")
            tensor = getattr(model.get_submodule(owner), name)
            stage.hold_tensor(path, tensor, persistent=path in persistent)
    return stage


def _stage_parameters(model: nn.Module, plan: PipelinePlan) -> list[dict[int, str]]:
    """Per stage: id -> name of every parameter it uses."""
    named = dict(model.named_parameters(remove_duplicate=False))
    used: list[dict[int, str]] = []
    for stage in range(plan.num_stages):
        if plan.layout is not None:
            paths = _hf_stage_paths(plan.layout, plan.bounds, stage)
        else:
            spec = plan.specs[stage]
            paths = spec.module_paths + spec.tensor_paths
        used.append({id(tensor): name for name, tensor in named.items()
                     if any(name == p or name.startswith(p + ".") for p in paths)})
    return used


def _hf_stage_paths(layout: HFLayout, bounds: list[int], stage: int) -> list[str]:
    first, last = stage == 0, stage == len(bounds) - 2
    blocks = [f"{layout.blocks}.{i}" for i in range(bounds[stage], bounds[stage + 1])]
    return ([layout.embed] if first else []) + blocks + layout.shared + (
        [layout.norm, layout.head] if last else [])


def _check_shared_parameters(model: nn.Module, plan: PipelinePlan, params: Any) -> None:
    """A parameter two stages use (tied weights) would need its gradients summed across
    stages every step: refuse it, naming both uses."""
    owners: dict[int, tuple[int, str]] = {}
    ranks = stage_ranks(params.pipeline_parallel_degree, params.stages_per_rank,
                        params.pipeline_schedule)
    for stage, used in enumerate(_stage_parameters(model, plan)):
        for key, name in used.items():
            if key in owners and owners[key][0] != stage:
                first_stage, first_name = owners[key]
                raise ConfigError(
                    f"{type(model).__name__} ties {first_name!r} (stage {first_stage}, pipeline "
                    f"rank {ranks[first_stage]}) to {name!r} (stage {stage}, pipeline rank "
                    f"{ranks[stage]}): one parameter used by two pipeline stages, e.g. an input "
                    "embedding tied to its output head. Their gradients would have to be summed "
                    "across stages every step, which this build does not do. Untie them (e.g. "
                    "tie_word_embeddings=False), or use pipeline_parallel_degree=1.")
            owners.setdefault(key, (stage, name))


__all__ = ["PipelinePlan", "build_pipeline", "check_pipeline_request", "plan_pipeline"]
