"""Delayed initialisation cases for hsdp_layouts.py (4 ranks): meta models and rank-0 loading."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from hsdp_support import (
    StorageTracker,
    TinyLM,
    build_llama,
    dataset,
    llama_config,
    local_rows,
    train,
)
from report import report
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import LlamaForCausalLM

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError

BIG = {"hidden": 256, "layers": 4, "vocab": 1024, "pad_token_id": 300}  # row 300: rank 1
LAYOUTS = {"full_shard": {}, "hybrid_2x2": {"hybrid_shard_degree": 2}}


def run_delayed_cases() -> None:
    for layout, params in LAYOUTS.items():
        meta_llama(layout, params)
        rank0_load(layout, params)
    meta_custom()
    rank0_on_meta()


def _local_bytes(model: nn.Module) -> int:
    return sum(_local(p).numel() * p.element_size() for p in model.parameters())


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def meta_llama(layout: str, params: dict[str, Any]) -> None:
    mr.init(params)
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(**BIG))
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with StorageTracker() as tracker:
        mr.transform(model)
    reference = LlamaForCausalLM(llama_config(**BIG))  # only to read the rotary buffer's value
    stats = _llama_init_stats(model)
    inv_freq = model.model.rotary_emb.inv_freq
    rows = local_rows(_tokens(1024), mr.state.dp_rank, mr.state.dp_size)
    result = train(model, rows, dp_size=mr.state.dp_size)
    report(
        {
            "case": "meta_llama",
            "layout": layout,
            "shard_degree": mr.state.hybrid_shard_degree,
            "shard_rank": mr.state.shard_rank,
            "full_bytes": full_bytes,
            "peak_bytes": tracker.peak,
            "local_bytes": _local_bytes(model),
            "inv_freq_error": float((inv_freq - reference.model.rotary_emb.inv_freq).abs().max()),
            "local_sum": float(sum(_local(p).double().sum() for p in model.parameters())),
            **stats,
            **result,
        }
    )
    mr.reset()


def _tokens(vocab: int) -> torch.Tensor:
    return dataset() % vocab


def _llama_init_stats(model: LlamaForCausalLM) -> dict[str, float]:
    """Global statistics (full_tensor, after materialisation) of a few parameters."""
    layer = model.model.layers[0]
    q_proj = layer.self_attn.q_proj.weight.detach().full_tensor()
    embed = model.model.embed_tokens.weight.detach().full_tensor()
    pad = model.config.pad_token_id
    half = q_proj.shape[0] // 2
    return {
        "q_proj_std": float(q_proj.std()),
        "q_proj_halves_equal": bool(torch.equal(q_proj[:half], q_proj[half:])),
        "norm_min": float(layer.input_layernorm.weight.full_tensor().min()),
        "norm_max": float(layer.input_layernorm.weight.full_tensor().max()),
        "embed_std": float(embed.std()),
        "pad_row_abs_max": float(embed[pad].abs().max()),
        "other_rows_min_abs_max": float(
            torch.cat([embed[:pad], embed[pad + 1 :]]).abs().amax(1).min()
        ),
        "initializer_range": model.config.initializer_range,
    }


def meta_custom() -> None:
    """A non-HF model on meta: materialised through each module's reset_parameters()."""
    mr.init({})
    with torch.device("meta"):
        model = TinyLM(vocab=512, width=128, depth=4)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with StorageTracker() as tracker:
        mr.transform(model)
    block = model.layers[0]
    fan_in = block.up.weight.shape[1]
    report(
        {
            "case": "meta_custom",
            "full_bytes": full_bytes,
            "peak_bytes": tracker.peak,
            "local_bytes": _local_bytes(model),
            "shard_degree": mr.state.hybrid_shard_degree,
            "up_max_abs": float(block.up.weight.detach().full_tensor().abs().max()),
            "up_bound": 1 / math.sqrt(fan_in),
            "norm_weight_ones": bool((block.norm.weight.full_tensor() == 1).all()),
            "norm_bias_zeros": bool((block.norm.bias.full_tensor() == 0).all()),
            "embed_std": float(model.embed.weight.detach().full_tensor().std()),
        }
    )
    mr.reset()


def rank0_load(layout: str, params: dict[str, Any]) -> None:
    """Rank 0 holds real weights, the others a meta model; each ends with its shard."""
    mr.init(params)
    if mr.state.rank == 0:
        model = build_llama(seed=0)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM(llama_config())
    mr.transform(model, load_state_dict_from_rank0=True)
    reference = build_llama(seed=0)  # what rank 0 had, rebuilt here only to compare
    expected = reference.state_dict()
    weight_error = max(
        float((value.full_tensor() - expected[key]).abs().max())
        for key, value in model.state_dict().items()
    )
    buffers_error = max(
        float((buffer - dict(reference.named_buffers())[name]).abs().max())
        for name, buffer in model.named_buffers()
    )
    local = _local_bytes(model)
    rows = local_rows(dataset(), mr.state.dp_rank, mr.state.dp_size)
    result = train(model, rows, dp_size=mr.state.dp_size)
    report(
        {
            "case": "rank0_load",
            "layout": layout,
            "weight_error": weight_error,
            "buffers_error": buffers_error,
            "local_bytes": local,
            "full_bytes": sum(p.numel() * p.element_size() for p in reference.parameters()),
            "shard_degree": mr.state.hybrid_shard_degree,
            **result,
        }
    )
    mr.reset()


def rank0_on_meta() -> None:
    """Rank 0 without real weights: every rank gets the ConfigError (none hangs)."""
    mr.init({})
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config())
    try:
        mr.transform(model, load_state_dict_from_rank0=True)
        report({"case": "rank0_on_meta", "error": None})
    except ConfigError as error:
        report({"case": "rank0_on_meta", "error": str(error)})
    dist.barrier()
    mr.reset()
