"""What one pod asks of its node: GPUs and EFA interfaces from the instance type, processes.

GPU counts and EFA interfaces per instance (``vpc.amazonaws.com/efa``, exposed by the EFA device
plugin on EKS) come from the instance table the SageMaker backend and the planner use, through
the job's Target (meshtrain.targets resolves the "k8s:" type; nothing here reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.targets import Target, target_of


@dataclass(frozen=True)
class NodeResources:
    """One pod's share of its node."""

    node_type: str
    """The node label value: the instance type without SageMaker's "ml." prefix."""
    gpus: int
    processes: int
    limits: dict[str, str]


def node_resources(spec: JobSpec, target: Target | None = None) -> NodeResources:
    """GPUs, EFA interfaces and processes per pod for `spec`'s instance type."""
    target = target_of(spec.instance_type, target)
    row = target.instance
    if row is None:  # a type of this machine ("local") rendered as a manifest
        raise ConfigError(
            f"instance_type={spec.instance_type!r}: a Kubernetes job names the node type it runs "
            "on as an ml.* type (e.g. 'ml.p4d.24xlarge', whose node label is p4d.24xlarge).")
    processes = spec.distribution_config().processes_per_host(target.gpus_per_host)
    limits: dict[str, str] = {}
    if target.gpus_per_host:
        limits["nvidia.com/gpu"] = str(target.gpus_per_host)
    if row.efa:
        limits["vpc.amazonaws.com/efa"] = str(row.efa_interfaces)
    return NodeResources(row.node_label, target.gpus_per_host, processes, limits)
