"""Hugging Face decoder LMs split through their own public forward.

Every stage runs the model's own ``forward``: the first stage calls the base model (e.g.
``LlamaModel``) with ``input_ids``, later stages with ``inputs_embeds`` (the previous stage's
hidden states), the last stage calls the ``...ForCausalLM`` so its head runs too. Each stage
calls a VIEW of those modules: a shallow copy whose block list holds only the stage's blocks
(at their original indices), without the input embedding after the first stage and with the
final norm only on the last. The model builds its masks (causal, sliding-window, per-layer
types) and rotary embeddings itself, as it would unsplit; no transformers helper is called.

`hf_layout` finds the pieces (``get_input_embeddings`` / ``get_output_embeddings``, the block
list, one final norm) or refuses; `verify_hf_split` runs every stage in turn on a few tokens at
transform() and refuses a model whose stages do not reproduce its logits (e.g. a forward that
scales ``inputs_embeds``, which every stage would then repeat).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.pipeline.stages import PipelineStageModule


@dataclass
class HFLayout:
    """Where an HF decoder's pieces are (module paths)."""

    base: str  # "model"
    embed: str  # "model.embed_tokens"
    blocks: str  # "model.layers"
    norm: str  # "model.norm"
    head: str  # "lm_head"
    shared: list[str] = field(default_factory=list)  # parameter-free: every stage


def is_hf_model(model: nn.Module) -> bool:
    """A transformers ``PreTrainedModel`` (by its public interface; no import needed)."""
    return getattr(model, "config", None) is not None and callable(
        getattr(model, "get_input_embeddings", None))


def hf_layout(model: nn.Module, blocks: list[nn.Module]) -> HFLayout:
    """The decoder's layout, or a ConfigError saying what does not fit."""
    name = type(model).__name__
    names = {id(m): n for n, m in model.named_modules()}
    parents = {names.get(id(b), "").rpartition(".")[0] for b in blocks}
    blocks_path = parents.pop() if len(parents) == 1 else ""
    container = model.get_submodule(blocks_path) if blocks_path else None
    base_path = blocks_path.rpartition(".")[0]
    embed, head = model.get_input_embeddings(), _output_embeddings(model)
    if (not isinstance(container, nn.ModuleList) or list(container) != list(blocks)
            or not base_path or "." in base_path or head is None):
        raise _unsupported(name, "its blocks are not one ModuleList of its base model, or it has "
                           "no output head (a ...ForCausalLM)")
    base = model.get_submodule(base_path)
    embed_name = next((n for n, m in base.named_children() if m is embed), None)
    head_name = next((n for n, m in model.named_children() if m is head), None)
    if embed_name is None or head_name is None:
        raise _unsupported(name, "its input embedding is not a child of its base model or its "
                           "head not a child of the model")
    others = [(n, m) for n, m in base.named_children()
              if n not in (embed_name, blocks_path.rpartition(".")[2])]
    learned = [n for n, m in others if _has_parameters(m)]
    outer = [n for n, m in model.named_children()
             if n not in (base_path, head_name) and _has_parameters(m)]
    if len(learned) != 1 or outer:
        raise _unsupported(name, f"besides the embedding, the blocks and the head it has modules "
                           f"with parameters {sorted(learned + outer)}, where pipelining places "
                           "exactly one (the final norm, on the last stage)")
    return HFLayout(base_path, f"{base_path}.{embed_name}", blocks_path,
                    f"{base_path}.{learned[0]}", head_name,
                    [f"{base_path}.{n}" for n, m in others if not _has_parameters(m)])


def check_hf_request(model: nn.Module) -> None:
    """What the stages cannot carry: router logits summed over every layer."""
    if getattr(model.config, "output_router_logits", False):
        raise ConfigError(
            f"{type(model).__name__} has output_router_logits=True: its auxiliary (load-"
            "balancing) loss sums the router logits of every layer, and pipeline stages each "
            "see only their own layers'. Set config.output_router_logits=False (forward_backward"
            "'s loss_fn takes the logits only), or use pipeline_parallel_degree=1.")


class HFStage(PipelineStageModule):
    """One stage of an HF decoder: the model's own forward on a view of its stage's modules."""

    def __init__(self, model: nn.Module, layout: HFLayout, index: int, num_stages: int,
                 block_indices: list[int]) -> None:
        super().__init__(index, num_stages, [f"{layout.blocks}.{i}" for i in block_indices])
        source = model.get_submodule(layout.base)
        base = shallow_module_copy(source)
        layers = nn.ModuleList()
        blocks = model.get_submodule(layout.blocks)
        for i in block_indices:
            layers.add_module(str(i), blocks[i])
        _set_child(base, layout.blocks, layers)
        _set_child(base, layout.embed, model.get_submodule(layout.embed) if self.is_first else None)
        _set_child(base, layout.norm,
                   model.get_submodule(layout.norm) if self.is_last else nn.Identity())
        base.config = _stage_config(source.config, block_indices)
        self.add_module(layout.base, base)
        causal = None
        if self.is_last:
            causal = shallow_module_copy(model)
            _set_child(causal, layout.base, base)
            self.add_module(layout.head, model.get_submodule(layout.head))
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_causal", causal)
        kept = ([layout.embed] if self.is_first else []) + layout.shared + (
            [layout.norm, layout.head] if self.is_last else [])
        self.leaves.extend((path, model.get_submodule(path)) for path in kept)
        self.leaves.extend((path, model.get_submodule(path)) for path in self.block_paths)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        given = {"input_ids" if self.is_first else "inputs_embeds": hidden}
        if self.is_last:
            return self._causal(**given, use_cache=False).logits
        return self._base(**given, use_cache=False).last_hidden_state


def verify_hf_split(model: nn.Module, layout: HFLayout, bounds: list[int]) -> None:
    """Run every stage in turn on a few tokens and compare with the unsplit model's logits."""
    config = model.config
    window = getattr(config, "sliding_window", None) or 0
    length = min(64, max(8, window + 2), getattr(config, "max_position_embeddings", 64) or 64)
    device = next(model.parameters()).device
    tokens = (torch.arange(length, device=device) % config.vocab_size).unsqueeze(0)
    count = len(bounds) - 1
    stages = [HFStage(model, layout, s, count, list(range(bounds[s], bounds[s + 1])))
              for s in range(count)]
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            expected = model(input_ids=tokens, use_cache=False).logits
            hidden = tokens
            for stage in stages:
                hidden = stage(hidden)
    finally:
        for module, training in modes.items():
            module.training = training
    tolerance = 1e-4 if expected.dtype == torch.float32 else 2e-2
    difference = float((hidden - expected).abs().max())
    if not torch.allclose(hidden, expected, rtol=tolerance, atol=tolerance):
        raise ConfigError(
            f"{type(model).__name__} cannot be split into pipeline stages through its own "
            "forward: its stages run in turn (inputs_embeds into every stage after the first) "
            f"do not reproduce the unsplit model's logits (largest difference {difference:.3g} "
            f"on {length} tokens), e.g. because its forward scales or adds to inputs_embeds. "
            "Use pipeline_parallel_degree=1 for this model.")


def shallow_module_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` that shares its submodules, parameters, buffers and hooks but has a
    child registry of its own, so children can be swapped on the copy only. nn.Module keeps
    children in ``_modules`` (a dict that ``copy.copy`` would share): the copy gets a new one
    (tests/runtime/test_pipeline_split.py checks the original is left as it was)."""
    view = copy.copy(module)
    object.__setattr__(view, "_modules", dict(module.named_children()))
    return view


def _stage_config(config: Any, block_indices: list[int]) -> Any:
    """The config a stage's view reads: per-layer lists (``layer_types``) for its blocks only,
    as forwards that enumerate their blocks (Qwen2's) index them by position."""
    stage_config = copy.copy(config)
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list | tuple) and len(layer_types) > max(block_indices):
        stage_config.layer_types = [layer_types[i] for i in block_indices]
    return stage_config


def _set_child(parent: nn.Module, path: str, module: nn.Module | None) -> None:
    parent.register_module(path.rpartition(".")[2], module)


def _output_embeddings(model: nn.Module) -> nn.Module | None:
    getter = getattr(model, "get_output_embeddings", None)
    return getter() if callable(getter) else None


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _unsupported(name: str, reason: str) -> ConfigError:
    return ConfigError(
        f"{name} cannot be split into pipeline stages: {reason}. Supported Hugging Face models "
        "are decoder LMs shaped like Llama, Mistral, Qwen2 and Mixtral (base_model.embed_tokens, "
        "base_model.layers, base_model.norm, lm_head). Use pipeline_parallel_degree=1.")


__all__ = ["HFLayout", "HFStage", "check_hf_request", "hf_layout", "is_hf_model",
           "shallow_module_copy", "verify_hf_split"]
