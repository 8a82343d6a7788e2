"""Pipeline parallelism: split a model into stages by its blocks (torch.distributed.pipelining).

`apply_pipeline` cuts the model's block list into ``pp x stages_per_rank`` stages (evenly, or
at ``pipeline_split_points``): the input embedding (and what runs before the blocks) on the
first stage, the final norm and head (what runs after) on the last. Each of this rank's stages
becomes a small nn.Module holding its modules at their ORIGINAL paths (``model.layers.3...``,
the block list a ModuleDict keyed by the original index), and the returned `PipelineModule`
holds all of them at those paths too, so ``state_dict()`` / ``named_parameters()`` of any
layout use the names of the unsplit model (DCP checkpoints move between layouts) and
``.parameters()`` is what the optimizer takes. Stage modules and the `PipelineModule` share
the module objects, so what later stages of ``transform`` do to a block (checkpointing,
compile, FSDP2 per stage) is seen through both.

Models: Hugging Face decoder LMs of the Llama family (``model.embed_tokens``, ``model.layers``,
``model.rotary_emb``, ``model.norm``, ``lm_head``: Llama, Mistral, Qwen2 without sliding
windows): each stage recomputes the rotary embeddings and the causal mask; and plain
nn.Modules whose forward applies their direct children in registration order (the block
ModuleList among them). torch's schedules run the stages: see `meshtrain_runtime.step`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from meshtrain.contract.errors import ConfigError

_V_SCHEDULES = ("ZBVZeroBubble",)


@dataclass
class StagePlan:
    """Where a model's pieces are: module paths before / after the blocks, the block list."""

    kind: str  # "hf" or "plain"
    blocks_path: str
    pre: list[str]
    post: list[str]
    shared: list[str] = field(default_factory=list)  # every stage (HF rotary embeddings)


class PipelineStageModule(nn.Module):
    """One stage: its modules at their original paths, and the forward that runs them."""

    def __init__(self, plan: StagePlan, index: int, num_stages: int, config: Any) -> None:
        super().__init__()
        self.stage_index, self.num_stages = index, num_stages
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_mask_fn", None)
        object.__setattr__(self, "leaves", [])  # (original path, module) of what it holds

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def stage_blocks(self) -> list[nn.Module]:
        return list(self.get_submodule(self._plan.blocks_path).values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._plan.kind == "hf":
            return self._forward_hf(x)
        for path in self._plan.pre if self.is_first else ():
            x = self.get_submodule(path)(x)
        for block in self.stage_blocks():
            x = block(x)
        for path in self._plan.post if self.is_last else ():
            x = self.get_submodule(path)(x)
        return x

    def _forward_hf(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self.get_submodule(self._plan.pre[0])(x)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask = self._mask_fn(config=self._config, inputs_embeds=x, attention_mask=None,
                             cache=None, position_ids=positions)
        rotary = self.get_submodule(self._plan.shared[0])(x, position_ids=positions)
        for block in self.stage_blocks():
            x = block(x, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        if self.is_last:
            for path in self._plan.post:
                x = self.get_submodule(path)(x)
        return x


class PipelineModule(nn.Module):
    """This rank's stages under the original parameter names; run it with forward_backward."""

    def __init__(self, stages: list[PipelineStageModule], params: Any) -> None:
        super().__init__()
        object.__setattr__(self, "stage_modules", stages)
        object.__setattr__(self, "pipeline_params", params)
        object.__setattr__(self, "runner", None)  # meshtrain_runtime.step builds it lazily
        for stage in stages:  # fresh containers: the stages' own trees stay as they are
            for path, module in stage.leaves:
                _attach(self, path, module)

    def local_blocks(self) -> list[nn.Module]:
        return [block for stage in self.stage_modules for block in stage.stage_blocks()]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            "This model is split into pipeline stages (pipeline_parallel_degree="
            f"{self.pipeline_params.pipeline_parallel_degree}): a stage cannot run the whole "
            "forward. Train with loss = meshtrain_runtime.forward_backward(model, inputs, "
            "targets, loss_fn=fn), which runs the pipeline schedule.")


def apply_pipeline(model: nn.Module, blocks: list[nn.Module], *, params: Any, pp_rank: int,
                   ) -> PipelineModule:
    """Split `model` by `blocks`; return the `PipelineModule` of rank `pp_rank`'s stages."""
    plan = plan_stages(model, blocks)
    pp, per_rank = params.pipeline_parallel_degree, params.stages_per_rank
    num_stages = pp * per_rank
    bounds = stage_bounds(len(blocks), num_stages, params.pipeline_split_points)
    _refuse_tied_embeddings(model, plan)
    config = getattr(model, "config", None)
    mask_fn = _hf_mask_function(model, blocks) if plan.kind == "hf" else None
    stages = []
    for index in local_stage_indices(pp_rank, pp, per_rank, params.pipeline_schedule):
        stage = PipelineStageModule(plan, index, num_stages, config)
        object.__setattr__(stage, "_mask_fn", mask_fn)
        first, last = index == 0, index == num_stages - 1
        paths = (plan.pre if first else []) + (plan.post if last else []) + plan.shared
        lo, hi = bounds[index], bounds[index + 1]
        stage.leaves.extend((path, model.get_submodule(path)) for path in paths)
        stage.leaves.extend((f"{plan.blocks_path}.{i}", blocks[i]) for i in range(lo, hi))
        _attach(stage, plan.blocks_path, nn.ModuleDict())  # kept even between HF parts
        for path, module in stage.leaves:
            _attach(stage, path, module)
        stages.append(stage)
    staged = PipelineModule(stages, params)
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


def stage_bounds(num_blocks: int, num_stages: int, split_points: list[int] | None) -> list[int]:
    """Block index bounds of every stage: stage s holds blocks[bounds[s]:bounds[s + 1]]."""
    if num_blocks < num_stages:
        raise ConfigError(
            f"The model has {num_blocks} blocks but the pipeline needs {num_stages} stages "
            "(pipeline_parallel_degree x pipeline_stages_per_rank), at least one block each. "
            f"Use at most {num_blocks} stages.")
    if split_points is not None:
        if split_points[-1] >= num_blocks:
            raise ConfigError(
                f"pipeline_split_points={split_points}: the model has {num_blocks} blocks "
                f"(indices 0-{num_blocks - 1}), so the last stage would be empty. Use split "
                f"points below {num_blocks}.")
        return [0, *split_points, num_blocks]
    base, extra = divmod(num_blocks, num_stages)
    bounds = [0]
    for stage in range(num_stages):
        bounds.append(bounds[-1] + base + (1 if stage < extra else 0))
    return bounds


def local_stage_indices(pp_rank: int, pp: int, per_rank: int, schedule: str) -> list[int]:
    """The stages rank `pp_rank` holds: looped (s, s + pp, ...) or a V (ZBVZeroBubble)."""
    if schedule in _V_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(per_rank)]


def plan_stages(model: nn.Module, blocks: list[nn.Module]) -> StagePlan:
    """Find the block ModuleList and the modules before / after it; ConfigError otherwise."""
    if not blocks:
        raise ConfigError(
            f"pipeline_parallel_degree > 1 but no blocks were found in {type(model).__name__}: "
            "stages are cut between blocks. Pass them: transform(model, blocks=[...]).")
    names = {id(m): n for n, m in model.named_modules()}
    parents = {n.rpartition(".")[0] for n in (names.get(id(b), "") for b in blocks)}
    blocks_path = parents.pop() if len(parents) == 1 else None
    container = model.get_submodule(blocks_path) if blocks_path else None
    if not isinstance(container, nn.ModuleList) or list(container) != list(blocks):
        raise ConfigError(
            f"Pipeline stages are cut from one nn.ModuleList of blocks; {type(model).__name__}'s "
            "blocks are not exactly the items of one ModuleList. Pass them: "
            "transform(model, blocks=list(model.layers)).")
    if _is_hf_decoder(model, blocks_path):
        base = blocks_path.rpartition(".")[0]
        return StagePlan("hf", blocks_path, pre=[f"{base}.embed_tokens"],
                         post=[f"{base}.norm", "lm_head"], shared=[f"{base}.rotary_emb"])
    return _plain_plan(model, blocks_path)


def _is_hf_decoder(model: nn.Module, blocks_path: str) -> bool:
    base, _, leaf = blocks_path.rpartition(".")
    if leaf != "layers" or not base or getattr(model, "config", None) is None:
        return False
    parts = [f"{base}.embed_tokens", f"{base}.norm", f"{base}.rotary_emb", "lm_head"]
    return all(_has(model, path) for path in parts)


def _plain_plan(model: nn.Module, blocks_path: str) -> StagePlan:
    if getattr(model, "config", None) is not None or "." in blocks_path:
        raise ConfigError(
            f"{type(model).__name__} is not a model pipelining can split: supported are Hugging "
            "Face decoder LMs of the Llama family (model.embed_tokens, model.layers, "
            "model.rotary_emb, model.norm, lm_head) and plain nn.Modules whose forward applies "
            "their direct children in order, the block ModuleList among them.")
    children = [name for name, _ in model.named_children()]
    at = children.index(blocks_path)
    return StagePlan("plain", blocks_path, pre=children[:at], post=children[at + 1:])


def _has(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def _hf_mask_function(model: nn.Module, blocks: list[nn.Module]) -> Any:
    """The mask the unsplit model builds: causal, or sliding-window where every layer slides."""
    types = {getattr(b, "attention_type", None) for b in blocks}
    if types - {None, "full_attention"}:
        raise ConfigError(
            f"{type(model).__name__} has layers typed as sliding-window attention; pipeline "
            "stages build one mask for every layer. Disable the sliding window in the config "
            "(e.g. use_sliding_window=False) or use pipeline_parallel_degree=1.")
    module = sys.modules[type(blocks[0]).__module__]
    # Mistral-style models: no per-layer type, every layer slides when the config has a window
    if types == {None} and getattr(model.config, "sliding_window", None) is not None:
        return module.create_sliding_window_causal_mask
    return module.create_causal_mask


def _refuse_tied_embeddings(model: nn.Module, plan: StagePlan) -> None:
    if not (plan.pre and plan.post):
        return
    first = {id(p) for p in model.get_submodule(plan.pre[0]).parameters()}
    if any(id(p) in first for path in plan.post for p in model.get_submodule(path).parameters()):
        raise ConfigError(
            f"{type(model).__name__} ties its input embedding to its output head, which live on "
            "the first and the last pipeline stage (different ranks): their gradients would "
            "have to be summed across stages every step, which this build does not do. Untie "
            "them (tie_word_embeddings=False) or use pipeline_parallel_degree=1.")


def _attach(root: nn.Module, path: str, module: nn.Module) -> None:
    """Register `module` at dotted `path` under `root`, creating plain containers on the way."""
    *parents, leaf = path.split(".")
    node = root
    for name in parents:
        if name not in node._modules:
            node.add_module(name, nn.Module())
        node = node._modules[name]
    node.add_module(leaf, module)


__all__ = ["PipelineModule", "PipelineStageModule", "apply_pipeline", "check_pipeline_request",
           "local_stage_indices",
           "plan_stages", "stage_bounds"]
