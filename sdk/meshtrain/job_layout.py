"""A job's layout, as `describe()["Layout"]`, `meshtrain describe` and `meshtrain list` show it:
the entry point and source, hosts x processes per host, the distribution, the resolved degrees
and the mesh axes they give.

One function builds it (`job_layout`) from what every backend keeps of a job: the JobSpec
(jobs under a jobs_dir, Kubernetes) or DescribeTrainingJob's HyperParameters and ResourceConfig
(SageMaker). Processes per host left to the default are the target's GPUs (else 1), as the
Estimator resolved them when it checked the layout.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from meshtrain.contract import hyperparameters as hp
from meshtrain.contract._messages import counted, hosts_and_processes
from meshtrain.contract.degrees import resolve_degrees
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.mesh_axes import LAYOUT_AXES, axis_size, describe_mesh

DEGREE_NAMES = ("pipeline_parallel_degree", "replicate_degree", "hybrid_shard_degree",
                "tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree")


@functools.lru_cache(maxsize=32)
def _gpus_per_host(instance_type: str) -> int:
    from meshtrain.targets import resolve_target

    try:
        return resolve_target(instance_type).gpus_per_host
    except ConfigError:  # a job submitted by a newer meshtrain, say: count it as CPU hosts
        return 0


def _distribution_name(config: DistributionConfig) -> str:
    if config.model_parallel_enabled:
        return "smdistributed.modelparallel"
    return "torch_distributed" if config.torch_distributed.enabled else "none"


def job_layout(distribution: DistributionConfig | None, *, instance_type: str,
               instance_count: int, entry_point: str, source_dir: str) -> dict[str, Any]:
    """The layout record of a job (DescribeTrainingJob's naming: PascalCase keys)."""
    config = distribution or DistributionConfig()
    per_host = config.processes_per_host(_gpus_per_host(instance_type))
    world = instance_count * per_host
    layout: dict[str, Any] = {
        "EntryPoint": entry_point, "SourceDir": source_dir, "InstanceCount": instance_count,
        "ProcessesPerHost": per_host, "WorldSize": world,
        "Distribution": _distribution_name(config),
    }
    if config.model_parallel_enabled:
        try:
            degrees = resolve_degrees(config.smp, world, ranks_per_host=per_host)
        except ConfigError as error:  # the Estimator checked it; a host may see other GPUs
            layout["Degrees"] = f"unresolved: {error}"
            return layout
        layout["Degrees"] = {name: getattr(degrees, name) for name in DEGREE_NAMES}
        layout["Degrees"]["sharding_strategy"] = degrees.sharding_strategy
        layout["MeshAxes"] = {axis.value: axis_size(degrees, axis) for axis in LAYOUT_AXES}
        layout["Mesh"] = describe_mesh(degrees)
    return layout


def layout_of_spec(spec: JobSpec) -> dict[str, Any]:
    """The layout of a job from the JobSpec it was submitted with."""
    return job_layout(spec.distribution, instance_type=spec.instance_type,
                      instance_count=spec.instance_count, entry_point=spec.entry_point,
                      source_dir=spec.source_dir)


def layout_of_description(description: Mapping[str, Any]) -> dict[str, Any] | None:
    """The layout of a job from DescribeTrainingJob's HyperParameters and ResourceConfig (the
    source is the uploaded sourcedir.tar.gz); None when they are missing."""
    encoded, resources = description.get("HyperParameters"), description.get("ResourceConfig")
    if not encoded or not resources:
        return None
    reserved, framework, user = hp.split_hyperparameters(hp.decode_hyperparameters(encoded))
    try:
        config = DistributionConfig.from_dict(hp.decode_distribution(framework, user))
    except ConfigError:  # written by another SDK: show what can be shown
        config = None
    return job_layout(config, instance_type=resources.get("InstanceType", ""),
                      instance_count=int(resources.get("InstanceCount", 1)),
                      entry_point=str(reserved.get(hp.PROGRAM, "")),
                      source_dir=str(reserved.get(hp.SUBMIT_DIRECTORY, "")))


def layout_rows(layout: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`meshtrain describe`'s rows for a layout: the script, the hosts, the mesh."""
    rows = [("Script", f"{layout['EntryPoint']} (source: {layout['SourceDir']})"),
            ("Hosts", f"{hosts_and_processes(layout['InstanceCount'], layout['ProcessesPerHost'])} "
                      f"= {counted(layout['WorldSize'], 'rank')}; {layout['Distribution']}")]
    degrees = layout.get("Degrees")
    if isinstance(degrees, str):
        rows.append(("Layout", degrees))
    elif degrees:
        rows.append(("Layout", f"{layout['Mesh']}; {degrees['sharding_strategy']}"))
    return rows


def layout_brief(layout: Mapping[str, Any] | None) -> str:
    """A short layout for `meshtrain list --wide`, e.g. ``2x2 pp2·shard2`` (axes above 1)."""
    if not layout:
        return "-"
    text = f"{layout['InstanceCount']}x{layout['ProcessesPerHost']}"
    axes = layout.get("MeshAxes") or {}
    parts = [f"{name}{size}" for name, size in axes.items() if size > 1]
    degrees = layout.get("Degrees")
    if isinstance(degrees, dict):
        parts += [f"{name}{degrees[degree]}" for name, degree in
                  (("cp", "context_parallel_degree"), ("ep", "expert_parallel_degree"))
                  if degrees[degree] > 1]
    return f"{text} {'·'.join(parts)}" if parts else text
