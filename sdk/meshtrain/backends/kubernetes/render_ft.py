"""A fault-tolerant job as Kubernetes objects: one PyTorchJob per replica group, plus torchft's
lighthouse as a Deployment and a Service (docs/fault-tolerance.md, docs/kubernetes.md).

Each replica group is a torchrun world of its own, so each is a PyTorchJob of its own
(``<job>-group-<g>``): its own c10d rendezvous at its own Master, its own restarts
(``restartPolicy: OnFailure`` with ``backoffLimit`` = max_restarts, so the operator restarts
that group's pods and no other group's). Its pods are told their group, the number of groups and
the lighthouse Service's cluster address (``MESHTRAIN_FT_*``), and where their hosts start
(``MESHTRAIN_HOST_OFFSET``: group g's Master 0 is algo-(g x hosts per group + 1)), so every host
keeps its job-wide name, data rows and records. All groups share the job's one ConfigMap.
"""

from __future__ import annotations

import copy
from typing import Any

from meshtrain.backends.kubernetes import checks
from meshtrain.backends.kubernetes.pods import PYTORCHJOB_API, labels, pod_template
from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import (
    FaultTolerance,
    lighthouse_arguments,
    rank_environment,
)
from meshtrain.contract.jobspec import JobSpec

GROUP_LABEL = "meshtrain.io/replica-group"
COMPONENT_LABEL = "meshtrain.io/component"
LIGHTHOUSE_PORT = 29510  # torchft's default lighthouse port
RDZV_PORT = 29400
FT_RDZV_KEYS = ("backend", "host", "port")


def group_job_name(job_name: str, group: int) -> str:
    """The PyTorchJob of replica group `group`."""
    return f"{job_name}-group-{group}"


def lighthouse_name(job_name: str) -> str:
    """The lighthouse's Deployment and Service."""
    return f"{job_name}-lighthouse"


def lighthouse_address(job_name: str, namespace: str) -> str:
    """What every rank is told (MESHTRAIN_FT_LIGHTHOUSE): the Service's cluster DNS name."""
    return f"http://{lighthouse_name(job_name)}.{namespace}.svc.cluster.local:{LIGHTHOUSE_PORT}"


def _lighthouse_labels(job_name: str) -> dict[str, str]:
    return {**labels(job_name), COMPONENT_LABEL: "lighthouse"}


def _group_rendezvous(spec: JobSpec, group: int, per_group: int,
                      rendezvous: dict[str, Any] | None) -> dict[str, Any]:
    """The group's elasticPolicy: its own rendezvous id (and, for c10d, its own Master)."""
    rendezvous = dict(rendezvous or {})
    unknown = sorted(set(rendezvous) - set(FT_RDZV_KEYS))
    if unknown:
        raise ConfigError(
            f"rendezvous keys {unknown} are not taken with fault_tolerance: each replica group's "
            f"world is exactly its {per_group} host(s) (one sharding group); use "
            f"{', '.join(FT_RDZV_KEYS)}.")
    backend = rendezvous.get("backend", "c10d")
    checks.check_rendezvous(backend, rendezvous)
    if backend == "c10d" and rendezvous.get("host"):
        raise ConfigError("rendezvous host= with fault_tolerance and c10d: each replica group "
                          "meets at its own Master (its c10d store); remove host=, or use an "
                          "etcd rendezvous (the groups' rendezvous ids differ).")
    name = group_job_name(spec.job_name, group)
    max_restarts = spec.distribution_config().torch_distributed.max_restarts
    return {"rdzvBackend": backend, "rdzvHost": rendezvous.get("host") or f"{name}-master-0",
            "rdzvPort": int(rendezvous.get("port") or (2379 if "etcd" in backend else RDZV_PORT)),
            "rdzvId": name, "minReplicas": per_group, "maxReplicas": per_group,
            "maxRestarts": max_restarts}


def _group_template(spec: JobSpec, ft: FaultTolerance, group: int, per_group: int,
                    namespace: str, base: dict[str, Any]) -> dict[str, Any]:
    """The job's pod template, told its group, its hosts' offset and its group's Master."""
    template = copy.deepcopy(base)
    template["metadata"]["labels"][GROUP_LABEL] = str(group)
    container = template["spec"]["containers"][0]
    env = [item for item in container["env"] if item["name"] != names.MESHTRAIN_MASTER_ADDR]
    told = {names.MESHTRAIN_MASTER_ADDR: f"{group_job_name(spec.job_name, group)}-master-0",
            names.MESHTRAIN_HOST_OFFSET: str(group * per_group),
            names.MESHTRAIN_FT_REPLICA_GROUP: str(group),
            names.MESHTRAIN_FT_REPLICA_GROUPS: str(ft.replica_groups),
            names.MESHTRAIN_FT_LIGHTHOUSE: lighthouse_address(spec.job_name, namespace),
            **rank_environment(ft)}
    container["env"] = env + [{"name": key, "value": value} for key, value in told.items()]
    return template


def render_group_job(spec: JobSpec, ft: FaultTolerance, group: int, *, namespace: str,
                     processes: int, base: dict[str, Any],
                     rendezvous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replica group `group`'s PyTorchJob: one Master and hosts-per-group - 1 Workers."""
    per_group = spec.instance_count // ft.replica_groups
    max_restarts = spec.distribution_config().torch_distributed.max_restarts
    template = _group_template(spec, ft, group, per_group, namespace, base)
    policy = "OnFailure" if max_restarts else "Never"  # the kubelet restarts this group's pods
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": policy,
                                           "template": template}}
    if per_group > 1:
        replicas["Worker"] = {"replicas": per_group - 1, "restartPolicy": policy,
                              "template": template}
    name = group_job_name(spec.job_name, group)
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {**labels(spec.job_name), GROUP_LABEL: str(group)}},
            "spec": {"nprocPerNode": str(processes), "pytorchReplicaSpecs": replicas,
                     "runPolicy": {"activeDeadlineSeconds": spec.max_run,
                                   "backoffLimit": max_restarts, "cleanPodPolicy": "None"},
                     "elasticPolicy": _group_rendezvous(spec, group, per_group, rendezvous)}}


def render_lighthouse(spec: JobSpec, ft: FaultTolerance, *, namespace: str
                      ) -> list[dict[str, Any]]:
    """[Deployment, Service]: one pod of the job's image running torchft's lighthouse."""
    name, selector = lighthouse_name(spec.job_name), _lighthouse_labels(spec.job_name)
    # torchft's own command (the image has torchft: its ranks import it); the import of torch
    # that lighthouse_entry.py skips for local jobs costs a long-lived pod nothing that matters
    container = {
        "name": "lighthouse", "image": spec.image_uri,
        "command": ["torchft_lighthouse", *lighthouse_arguments(ft),
                    "--bind", f"[::]:{LIGHTHOUSE_PORT}"],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "ports": [{"name": "lighthouse", "containerPort": LIGHTHOUSE_PORT}],
        "readinessProbe": {"tcpSocket": {"port": "lighthouse"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
    }
    metadata = {"name": name, "namespace": namespace, "labels": selector}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata,
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                 "selector": {"matchLabels": selector},
                 "template": {"metadata": {"labels": selector},
                              "spec": {"containers": [container]}}}}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": copy.deepcopy(metadata),
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "lighthouse", "port": LIGHTHOUSE_PORT,
                            "targetPort": "lighthouse", "protocol": "TCP"}]}}
    return [deployment, service]


def render_fault_tolerant(spec: JobSpec, ft: FaultTolerance, *, namespace: str,
                          processes: int, limits: dict[str, str], node_type: str,
                          rendezvous: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """[PyTorchJob of group 0, ..., of group N-1, lighthouse Deployment, lighthouse Service]."""
    per_group = spec.instance_count // ft.replica_groups
    checks.check_group_names(spec.job_name, ft.replica_groups, per_group,
                             lighthouse_name(spec.job_name))
    base = pod_template(spec, limits, node_type)
    jobs = [render_group_job(spec, ft, group, namespace=namespace, processes=processes,
                             base=base, rendezvous=rendezvous)
            for group in range(ft.replica_groups)]
    return [*jobs, *render_lighthouse(spec, ft, namespace=namespace)]
