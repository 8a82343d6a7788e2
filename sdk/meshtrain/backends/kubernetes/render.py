"""A JobSpec as Kubernetes objects: a ConfigMap with the job's /opt/ml contract and a Kubeflow
PyTorchJob (training operator v1) or TrainJob (Trainer v2), with no cluster and no client needed.

Every pod runs meshtrain's bootstrap, as on SageMaker: it reads the ConfigMap's
hyperparameters.json / inputdataconfig.json / resourceconfig.json (mounted at
/opt/ml/input/config), learns which host it is from the operator's replica labels (downward API:
Master 0 is algo-1, Worker i is algo-(i+2)), unpacks the code and starts torchrun. The source is
shipped in the ConfigMap as sourcedir.tar.gz (up to `MAX_CONFIGMAP_CODE_BYTES`), taken from an
S3 URI, or taken from the image's /opt/ml/code (`code_in_image=True`).
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path
from typing import Any

from meshtrain.backends.kubernetes import checks
from meshtrain.backends.kubernetes.pods import (
    CODE_ARCHIVE_DIR,
    PYTORCHJOB_API,
    labels,
    pod_template,
)
from meshtrain.backends.kubernetes.render_ft import render_fault_tolerant
from meshtrain.backends.kubernetes.resources import node_resources
from meshtrain.contract.archive import write_sourcedir_tarball
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.support import check_fault_tolerance_supported
from meshtrain.targets import Target

MAX_CONFIGMAP_CODE_BYTES = 900 * 1024  # a ConfigMap holds at most 1 MiB in all
TRAINJOB_API = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_RUNTIME = "torch-distributed"  # Trainer v2's ClusterTrainingRuntime for torchrun jobs


def _code_archive(spec: JobSpec) -> bytes:
    with tempfile.TemporaryDirectory() as scratch:
        tarball = Path(scratch) / "sourcedir.tar.gz"
        write_sourcedir_tarball(Path(spec.source_dir), tarball,
                                [Path(d) for d in spec.dependencies])
        data = tarball.read_bytes()
    if len(data) > MAX_CONFIGMAP_CODE_BYTES:
        raise ConfigError(
            f"source_dir={spec.source_dir} packs to {len(data) / 1024:.0f} KiB, more than the "
            f"{MAX_CONFIGMAP_CODE_BYTES // 1024} KiB a ConfigMap can carry: bake the code into the "
            "image (code_in_image=True, at /opt/ml/code) or give an s3:// source_dir.")
    return data


def _submit_directory(spec: JobSpec, code_in_image: bool) -> str:
    if code_in_image:
        return ""  # the bootstrap finds the entry point already in /opt/ml/code
    if spec.source_dir.startswith("s3://"):
        return spec.source_dir
    return f"file://{CODE_ARCHIVE_DIR}/sourcedir.tar.gz"


def render_config_map(spec: JobSpec, *, namespace: str, code_in_image: bool = False
                      ) -> dict[str, Any]:
    """The ConfigMap with the contract files (and the code, when it travels with the job)."""
    resource = spec.resource_config("algo-1")
    del resource["current_host"]  # each pod fills in its own, from its replica labels
    data = {
        "hyperparameters.json": spec.container_hyperparameters(
            _submit_directory(spec, code_in_image)),
        "resourceconfig.json": resource,
        "inputdataconfig.json": spec.input_data_config(),
    }
    config_map: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{spec.job_name}-config", "namespace": namespace,
                     "labels": labels(spec.job_name)},
        "data": {name: json.dumps(value, indent=2, sort_keys=True)
                 for name, value in data.items()},
    }
    if not code_in_image and not spec.source_dir.startswith("s3://"):
        config_map["binaryData"] = {
            "sourcedir.tar.gz": base64.b64encode(_code_archive(spec)).decode()}
    return config_map


def elastic_policy(spec: JobSpec, rendezvous: dict[str, Any]) -> dict[str, Any]:
    """A PyTorchJob elasticPolicy; the operator hands it to every pod as torchrun's PET_RDZV_*
    variables, which the bootstrap's elastic rendezvous reads (meshtrain_runtime.host)."""
    backend = rendezvous.get("backend", "c10d")
    checks.check_rendezvous(backend, rendezvous)
    host = rendezvous.get("host") or f"{spec.job_name}-master-0"
    minimum = rendezvous.get("min_replicas") or spec.instance_count
    if not 1 <= minimum <= spec.instance_count:
        raise ConfigError(f"min_replicas={minimum} must be between 1 and instance_count="
                          f"{spec.instance_count}.")
    return {"rdzvBackend": backend, "rdzvHost": host,
            "rdzvPort": int(rendezvous.get("port") or (2379 if "etcd" in backend else 29400)),
            "rdzvId": spec.job_name, "minReplicas": minimum, "maxReplicas": spec.instance_count,
            "maxRestarts": spec.distribution_config().torch_distributed.max_restarts}


def render_pytorchjob(spec: JobSpec, *, namespace: str, processes: int, limits: dict[str, str],
                      node_type: str, rendezvous: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
    """A kubeflow.org/v1 PyTorchJob: one Master, instance_count - 1 Workers."""
    template = pod_template(spec, limits, node_type)
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "Never",
                                           "template": template}}
    if spec.instance_count > 1:
        replicas["Worker"] = {"replicas": spec.instance_count - 1, "restartPolicy": "Never",
                              "template": template}
    job_spec: dict[str, Any] = {
        "nprocPerNode": str(processes),
        "pytorchReplicaSpecs": replicas,
        "runPolicy": {"activeDeadlineSeconds": spec.max_run, "backoffLimit": 0,
                      "cleanPodPolicy": "None"},
    }
    if spec.distribution_config().torch_distributed.max_restarts and not rendezvous:
        rendezvous = {"backend": "c10d"}  # restarts need a rendezvous the hosts can re-join
    if rendezvous:
        job_spec["elasticPolicy"] = elastic_policy(spec, rendezvous)
    return {"apiVersion": PYTORCHJOB_API, "kind": "PyTorchJob",
            "metadata": {"name": spec.job_name, "namespace": namespace,
                         "labels": labels(spec.job_name)},
            "spec": job_spec}


def render_trainjob(spec: JobSpec, *, namespace: str, processes: int, limits: dict[str, str],
                    node_type: str) -> dict[str, Any]:
    """A trainer.kubeflow.org/v1alpha1 TrainJob on the torch-distributed runtime, with the
    contract's volumes, env and node selector patched into its pods."""
    template = pod_template(spec, limits, node_type, kind="TrainJob")
    container = template["spec"]["containers"][0]
    pod_patch = {"nodeSelector": template["spec"]["nodeSelector"],
                 "volumes": template["spec"]["volumes"],
                 "containers": [{"name": "node", "env": container["env"],
                                 "volumeMounts": container["volumeMounts"]}]}
    trainer: dict[str, Any] = {"image": spec.image_uri, "command": container["command"],
                               "numNodes": spec.instance_count, "numProcPerNode": processes}
    if limits:
        trainer["resourcesPerNode"] = {"limits": dict(limits), "requests": dict(limits)}
    return {
        "apiVersion": TRAINJOB_API, "kind": "TrainJob",
        "metadata": {"name": spec.job_name, "namespace": namespace,
                     "labels": labels(spec.job_name)},
        "spec": {
            "runtimeRef": {"name": TRAINJOB_RUNTIME, "apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime"},
            "activeDeadlineSeconds": spec.max_run,
            "trainer": trainer,
            "runtimePatches": [{"manager": "meshtrain", "trainingRuntimeSpec": {"template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {
                    "template": {"metadata": {"labels": labels(spec.job_name)},
                                 "spec": pod_patch}}}}]}}}}],
        },
    }


def render_spec(spec: JobSpec, *, namespace: str = "default", kind: str = "PyTorchJob",
                code_in_image: bool = False, rendezvous: dict[str, Any] | None = None,
                target: Target | None = None) -> list[dict[str, Any]]:
    """[ConfigMap, job] for `spec`; with torch_distributed.fault_tolerance [ConfigMap,
    PyTorchJob per replica group, lighthouse Deployment, Service] (render_ft.py). ConfigError
    before anything is rendered. `rendezvous`
    (PyTorchJob only) asks for an elastic one: backend ("c10d", "etcd" or "etcd-v2"), host,
    port, min_replicas; the distribution's torch_distributed.max_restarts becomes maxRestarts."""
    if kind == "TrainJob" and spec.distribution_config().torch_distributed.max_restarts:
        raise ConfigError("torch_distributed.max_restarts is honoured through a PyTorchJob's "
                          "elasticPolicy; a TrainJob's runtime owns its restarts. Use "
                          "kind='PyTorchJob' or remove max_restarts.")
    if rendezvous and kind != "PyTorchJob":
        raise ConfigError("rendezvous= is rendered for PyTorchJob only (a TrainJob's runtime "
                          "owns its rendezvous).")
    fault_tolerance = spec.distribution_config().torch_distributed.fault_tolerance
    if fault_tolerance and kind != "PyTorchJob":
        check_fault_tolerance_supported(
            fault_tolerance.replica_groups, "Kubernetes as a TrainJob",
            "each replica group must be a world of its own, restarted alone, which is rendered "
            "as one PyTorchJob per group (kind='PyTorchJob')")
    checks.check_kind(kind)
    checks.check_namespace(namespace)
    resources = node_resources(spec, target)
    checks.check_spec(spec, gpus=resources.gpus, processes=resources.processes)
    config_map = render_config_map(spec, namespace=namespace, code_in_image=code_in_image)
    common = {"namespace": namespace, "processes": resources.processes,
              "limits": resources.limits, "node_type": resources.node_type}
    if fault_tolerance:  # one PyTorchJob per replica group + the lighthouse
        return [config_map, *render_fault_tolerant(spec, fault_tolerance, rendezvous=rendezvous,
                                                   **common)]
    if kind == "PyTorchJob":
        return [config_map, render_pytorchjob(spec, rendezvous=rendezvous, **common)]
    return [config_map, render_trainjob(spec, **common)]
