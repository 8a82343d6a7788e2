"""The pod every kind of Kubeflow job runs (render.py's plain jobs, render_ft.py's replica groups):
meshtrain's bootstrap with the job's /opt/ml contract mounted from its ConfigMap, told its job
and its place in the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshtrain.backends.kubernetes import checks
from meshtrain.contract import env as names
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.paths import DEFAULT_BASE_DIR, OptMLPaths

MASTER_PORT = 23456  # the training operator's default (container port "pytorchjob-port")
CONTAINER_PATHS = OptMLPaths(Path(DEFAULT_BASE_DIR))
CONFIG_DIR = str(CONTAINER_PATHS.input_config_dir)
CODE_ARCHIVE_DIR = "/opt/meshtrain/code"
JOB_LABEL = "meshtrain.io/job-name"
MANAGED_BY = {"app.kubernetes.io/managed-by": "meshtrain"}
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
PYTORCHJOB_API = "kubeflow.org/v1"


def labels(job_name: str) -> dict[str, str]:
    """The labels every object and pod of the job carries (how meshtrain finds them again)."""
    return {JOB_LABEL: job_name, **MANAGED_BY}


def _volumes(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the contract, code, /dev/shm, channels, outputs."""
    paths = CONTAINER_PATHS
    config = f"{spec.job_name}-config"
    volumes: list[dict[str, Any]] = [
        {"name": "contract", "configMap": {"name": config, "items": [
            {"key": key, "path": key} for key in
            ("hyperparameters.json", "resourceconfig.json", "inputdataconfig.json")]}},
        {"name": "code", "configMap": {"name": config, "optional": True, "items": [
            {"key": "sourcedir.tar.gz", "path": "sourcedir.tar.gz"}]}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "contract", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "code", "mountPath": CODE_ARCHIVE_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    claims: dict[str, str] = {}
    targets = [(f"input channel {c!r}", uri, str(paths.channel_dir(c)), True)
               for c, uri in sorted(spec.inputs.items())]
    if spec.output_path:
        targets.append(("output_path", spec.output_path, str(paths.model_dir), False))
    for what, uri, mount_path, read_only in targets:
        claim, sub_path = checks.pvc_mount(uri, what)
        volume = claims.setdefault(claim, f"pvc-{len(claims)}")
        mounts.append({"name": volume, "mountPath": mount_path, "subPath": sub_path,
                       "readOnly": read_only} if sub_path else
                      {"name": volume, "mountPath": mount_path, "readOnly": read_only})
    volumes += [{"name": volume, "persistentVolumeClaim": {"claimName": claim}}
                for claim, volume in claims.items()]
    return volumes, mounts


def _identity_env(spec: JobSpec, kind: str) -> list[dict[str, Any]]:
    """Where the master is and which host this pod is, as each kind's pods can tell."""
    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    if kind == "PyTorchJob":
        return [
            {"name": names.MESHTRAIN_MASTER_ADDR, "value": f"{spec.job_name}-master-0"},
            {"name": names.MESHTRAIN_REPLICA_TYPE,
             "valueFrom": field(f"metadata.labels['{REPLICA_TYPE_LABEL}']")},
            {"name": names.MESHTRAIN_REPLICA_INDEX,
             "valueFrom": field(f"metadata.labels['{REPLICA_INDEX_LABEL}']")},
        ]
    return [  # TrainJob: a JobSet of indexed Jobs; pod 0 of job "node" is the master
        {"name": names.MESHTRAIN_MASTER_ADDR, "value": f"{spec.job_name}-node-0-0.{spec.job_name}"},
        {"name": names.MESHTRAIN_NODE_RANK,
         "valueFrom": field(f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']")},
    ]


def _env(spec: JobSpec, kind: str) -> list[dict[str, Any]]:
    """The user's environment, the job's name, and the pod's place in the job."""
    env = [{"name": key, "value": value} for key, value in sorted(spec.environment.items())]
    env += [{"name": names.MESHTRAIN_MASTER_PORT, "value": str(MASTER_PORT)},
            {"name": names.MESHTRAIN_JOB_NAME, "value": spec.job_name}]
    return env + _identity_env(spec, kind)


def pod_template(spec: JobSpec, limits: dict[str, str], node_type: str,
                  kind: str = "PyTorchJob") -> dict[str, Any]:
    volumes, mounts = _volumes(spec)
    container = {
        "name": "pytorch", "image": spec.image_uri,
        "command": ["python3", "-m", names.BOOTSTRAP_MODULE],
        "env": _env(spec, kind), "volumeMounts": mounts,
        "ports": [{"containerPort": MASTER_PORT, "name": "pytorchjob-port"}],
    }
    if limits:
        container["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    return {
        "metadata": {"labels": labels(spec.job_name)},
        "spec": {"containers": [container], "volumes": volumes, "restartPolicy": "Never",
                 "nodeSelector": {"node.kubernetes.io/instance-type": node_type}},
    }
