"""JSON Schema (draft 2020-12) of `meshtrain plan --json` output, schema_version 4 (2 added
`memory_bytes.phases` and `memory_bytes.peak_phase`; 3 added `degrees.reshard_after_forward`,
the encoder-decoder fields of `model` and `training.decoder_seq_len`; 4 added pipeline
parallelism: `degrees.pipeline_parallel_degree`, a candidate's `pipeline`,
`communication_bytes_per_step.pipeline_p2p`, `estimate.bubble_fraction` and the
`training.microbatches` / `training.pipeline_schedule` the pipeline candidates assume; every
earlier field keeps its meaning).

All byte counts are per GPU (per rank) and integers; communication bytes are what one GPU
sends per optimizer step. docs/planner.md describes every field.
"""

from __future__ import annotations

from typing import Any, get_args

from meshtrain.plan.phases import PHASES
from meshtrain.plan.spec import Family

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BYTES = {"type": "integer", "minimum": 0}
_OPT_BYTES = {"type": ["integer", "null"]}


def _object(properties: dict[str, Any], *, extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": extra}


def _bytes_map() -> dict[str, Any]:
    return {"type": "object", "additionalProperties": _BYTES}


_CANDIDATE = _object({
    "rank": {"type": "integer", "minimum": 1},
    "layout": {"type": "object"},
    "distribution": {"type": "object"},
    "degrees": _object({key: {"type": "integer", "minimum": 1} for key in (
        "world_size", "replicate_degree", "hybrid_shard_degree", "tensor_parallel_degree",
        "expert_parallel_degree", "context_parallel_degree", "data_parallel_degree",
        "pipeline_parallel_degree")}
        | {"sharding_strategy": {"enum": ["full_shard", "hybrid_shard", "shard_grad_op",
                                          "_hybrid_shard_zero2", "no_shard"]},
           "reshard_after_forward": {"type": "boolean"}}),
    "fits": {"type": ["boolean", "null"]},
    "pipeline": {"anyOf": [{"type": "null"}, _object({
        "schedule": {"type": "string"}, "microbatches": _INT, "stages_per_rank": _INT,
        "rows_per_microbatch": _INT, "blocks_per_stage": _INT, "in_flight_first": _INT,
        "in_flight_last": _INT, "bubble_fraction": _NUM, "p2p_bytes_per_boundary": _BYTES,
        "p2p_bytes_per_rank": _BYTES, "peak_stage": {"enum": ["first", "last"]},
    })]},
    "memory_bytes": _object({
        "parameters": _BYTES, "gradients": _BYTES, "optimizer_states": _BYTES,
        "model_states": _BYTES, "activations": _BYTES, "temporary_buffers": _BYTES,
        "temporary_breakdown": _bytes_map(), "optimizer_step_buffers": _BYTES, "peak": _BYTES,
        "reserve": _BYTES, "capacity": _OPT_BYTES, "headroom": _OPT_BYTES,
        "peak_phase": {"enum": list(PHASES)},
        "phases": _object({name: _object({"total": _BYTES, "terms": _bytes_map()})
                           for name in PHASES}),
    }),
    "activations": _object({
        "per_layer": _BYTES, "per_layer_breakdown": _bytes_map(),
        "layers_stored_in_full": _INT, "layers_checkpointed": _INT,
        "checkpoints_on_gpu": _INT, "per_checkpoint": _BYTES, "model_terms": _bytes_map(),
        "encoder_layers": _INT, "per_encoder_layer": _BYTES,
    }),
    "communication_bytes_per_step": _object({key: _BYTES for key in (
        "fsdp_all_gather", "fsdp_reduce_scatter", "data_parallel_all_reduce",
        "tensor_parallel", "expert_all_to_all", "context_parallel", "pipeline_p2p",
        "total")}),
    "estimate": _object({
        "compute_s": _NUM, "overlapped_communication_s": _NUM, "exposed_communication_s": _NUM,
        "step_s": _NUM, "tokens_per_step": _INT, "tokens_per_s": _NUM, "bubble_fraction": _NUM,
    }),
    "reasoning": {"type": "string"},
})

PLAN_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "meshtrain plan --json",
    **_object({
        "schema_version": {"const": 4},
        "convention": {"enum": ["zero", "smp"]},
        "model": _object({
            "name": {"type": "string"}, "source": {"type": "string"},
            "family": {"enum": list(get_args(Family))},
            **{key: _INT for key in (
                "num_params", "hidden_size", "num_layers", "num_attention_heads",
                "num_key_value_heads", "intermediate_size", "vocab_size", "num_experts",
                "experts_per_token", "num_decoder_layers")},
        }),
        "cluster": _object({
            "instance_type": {"type": ["string", "null"]}, "num_nodes": _INT,
            "ranks_per_node": _INT, "world_size": _INT, "gpu_memory_bytes": _BYTES,
            "reserve_bytes": _BYTES, "capacity_bytes": _OPT_BYTES,
        }),
        "training": _object({
            "seq_len": _INT, "micro_batch": _INT, "precision": {"enum": ["bf16", "fp16", "fp32"]},
            "optimizer": {"type": "string"}, "fused_optimizer": {"type": "boolean"},
            "optimizer_offload": {"type": "boolean"},
            "compute_efficiency": _NUM, "decoder_seq_len": {"type": ["integer", "null"]},
            "microbatches": {"type": ["integer", "null"]}, "pipeline_schedule": {"type": "string"},
        }),
        "model_state_bytes_per_gpu": _object({
            "data_parallel_degree": _INT, "ddp": _BYTES, "zero1": _BYTES, "zero2": _BYTES,
            "zero3": _BYTES,
        }),
        "num_candidates": _INT,
        "num_fitting": _INT,
        "recommendation": {"anyOf": [{"type": "null"}, _CANDIDATE]},
        "candidates": {"type": "array", "items": _CANDIDATE},
        "smallest_fitting_node_count": {"type": ["integer", "null"]},
    }),
}

__all__ = ["PLAN_JSON_SCHEMA"]
