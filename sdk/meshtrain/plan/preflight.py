"""Pre-flight: estimate the layout a job asks for and refuse one that cannot fit.

The Estimator calls `preflight` before a launch (unless ``preflight=False``). It resolves the
distribution's SMP parameters against the cluster exactly as the runtime will (through
`resolve_degrees`), estimates the peak memory per GPU, and raises `ConfigError` when it exceeds
the GPU's memory minus the reserve. The message shows the estimate and a layout that would fit:
on the same cluster when one exists, else the fewest instances of the same type that suffice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError
from meshtrain.instances import gpus_per_instance
from meshtrain.plan.cluster import Cluster, build_cluster
from meshtrain.plan.layouts import (
    LayoutEstimate,
    PipelineOptions,
    Plan,
    estimate_layout,
    plan_layouts,
    smallest_fitting_count,
)
from meshtrain.plan.memory import Training, zero_stage_bytes
from meshtrain.plan.models import ModelSpec, resolve_model
from meshtrain.plan.report import distribution_for, memory_text, short_layout


def preflight(
    distribution: DistributionConfig | Mapping[str, Any] | None,
    *,
    model: str | Path | Mapping[str, Any] | ModelSpec,
    instance_type: str,
    instance_count: int = 1,
    processes_per_host: int | None = None,
    seq_len: int = 4096,
    micro_batch: int = 1,
    decoder_seq_len: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    convention: str = "zero",
    fused_optimizer: bool = False,
    gpu_memory_gib: float | None = None,
    reserve_gib: float | None = None,
) -> Plan:
    """Estimate `distribution`'s layout; raise ConfigError if it cannot fit, else return the plan.

    `model` is a preset name, a config.json path, a Hugging Face config dict or a ModelSpec.
    The distribution's ``mixed_precision`` overrides `precision`. Without model parallelism
    enabled the runtime's defaults apply (full sharding over all ranks). On instance types
    without GPUs (CPU types, "local") nothing is refused unless `gpu_memory_gib` is given.
    The returned Plan holds one candidate: the layout asked for. `decoder_seq_len`: an
    encoder-decoder's decoder length (`seq_len` is then the encoder's).
    """
    config = distribution if isinstance(distribution, DistributionConfig) else \
        DistributionConfig.from_dict(dict(distribution) if distribution is not None else None)
    spec = resolve_model(model)
    training = Training(seq_len=seq_len, micro_batch=micro_batch,
                        precision=config.smp.mixed_precision or precision,
                        optimizer=optimizer, convention=convention,  # type: ignore[arg-type]
                        fused_optimizer=fused_optimizer, decoder_seq_len=decoder_seq_len)
    ranks = processes_per_host or config.processes_per_host(gpus_per_instance(instance_type))

    def build(count: int) -> Cluster:
        return build_cluster(instance_type=instance_type, instance_count=count,
                             processes_per_host=ranks, gpu_memory_gib=gpu_memory_gib,
                             reserve_gib=reserve_gib)

    cluster = build(instance_count)
    estimate = estimate_layout(spec, config.smp, cluster, training)
    plan = Plan(spec, cluster, training, [estimate],
                zero_stage_bytes(spec, cluster.world_size, training))
    if estimate.fits is False:
        raise ConfigError(_refusal(spec, estimate, plan, build))
    return plan


def _refusal(spec: ModelSpec, estimate: LayoutEstimate, plan: Plan, build: Any) -> str:
    cluster, training = plan.cluster, plan.training
    head = (f"Pre-flight: {spec.name} ({spec.num_params / 1e9:.1f}B parameters, seq_len "
            f"{training.seq_len}, micro_batch {training.micro_batch}, {training.precision}, "
            f"{training.optimizer}, {training.convention} convention) does not fit on "
            f"{cluster.description} with {short_layout(estimate)} "
            f"({estimate.describe()}):\n{memory_text(estimate)}\n")
    if estimate.pipeline is not None:
        terms = estimate.pipeline
        head += (f"  pipeline: the {terms.peak_stage} rank peaks, holding {terms.blocks_per_stage}"
                 f" block(s) per stage x {terms.stages_per_rank} stage(s) and "
                 f"{max(terms.in_flight_first, terms.in_flight_last)} in-flight "
                 f"chunk-microbatch(es) of {terms.rows_per_microbatch} row(s) "
                 f"({terms.schedule}, microbatches={terms.microbatches})\n")
    pipeline = PipelineOptions(estimate.parameters.microbatches if estimate.pipeline else None,
                               estimate.parameters.pipeline_schedule)
    comm_type = estimate.parameters.cp_comm_type  # cp suggestions keep the job's type
    alternative = plan_layouts(spec, cluster, training, pipeline=pipeline,
                               cp_comm_type=comm_type).best
    if alternative is not None and alternative.fits:
        return head + _suggest(alternative, "A layout that fits on this cluster")
    found = smallest_fitting_count(spec, training, build, above=cluster.num_nodes,
                                   pipeline=pipeline, cp_comm_type=comm_type)
    if found is None:
        return head + ("No layout fits on up to 512 instances of this type: use GPUs with more "
                       "memory, a shorter sequence or a smaller micro-batch.")
    count, bigger = found
    return head + (f"No layout fits on {cluster.num_nodes} instance(s). With instance_count="
                   f"{count}: " + _suggest(bigger.best, "this layout fits"))  # type: ignore[arg-type]


def _suggest(estimate: LayoutEstimate, what: str) -> str:
    distribution = distribution_for(estimate)
    return (f"{what} ({short_layout(estimate)}, peak {estimate.memory.peak_bytes / 2**30:.1f} "
            f"GiB per GPU):\n  distribution={json.dumps(distribution)}\n"
            "Or pass preflight=False to launch anyway.")


__all__ = ["preflight"]
