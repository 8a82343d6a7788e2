"""What one pod asks of its node: GPUs and EFA interfaces from the instance type, processes.

GPU counts come from the same table the SageMaker backend and the planner use (via targets.py).
EFA interfaces per instance (``vpc.amazonaws.com/efa``, exposed by the EFA device plugin on EKS)
are from the AWS EC2 user guide's table of EFA-capable instance types.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtrain.contract.jobspec import JobSpec
from meshtrain.targets import KUBERNETES_PREFIX, resolve_target

EFA_INTERFACES = {
    "p3dn.24xlarge": 1, "p4d.24xlarge": 4, "p4de.24xlarge": 4, "p5.48xlarge": 32,
    "p5e.48xlarge": 32, "p5en.48xlarge": 16, "p6-b200.48xlarge": 8,
}


@dataclass(frozen=True)
class NodeResources:
    """One pod's share of its node."""

    node_type: str
    """The node label value: the instance type without SageMaker's "ml." prefix."""
    gpus: int
    processes: int
    limits: dict[str, str]


def node_resources(spec: JobSpec) -> NodeResources:
    """GPUs, EFA interfaces and processes per pod for `spec`'s instance type."""
    target = resolve_target(spec.instance_type)
    node_type = spec.instance_type.removeprefix(KUBERNETES_PREFIX).removeprefix("ml.")
    processes = spec.distribution_config().processes_per_host(target.gpus_per_host)
    limits: dict[str, str] = {}
    if target.gpus_per_host:
        limits["nvidia.com/gpu"] = str(target.gpus_per_host)
    if EFA_INTERFACES.get(node_type):
        limits["vpc.amazonaws.com/efa"] = str(EFA_INTERFACES[node_type])
    return NodeResources(node_type, target.gpus_per_host, processes, limits)
