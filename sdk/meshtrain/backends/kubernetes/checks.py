"""What a Kubernetes job needs that other targets do not, checked before anything is rendered."""

from __future__ import annotations

import re
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
MAX_NAME = 63
WORKER_SUFFIX = "-worker-"
KINDS = ("PyTorchJob", "TrainJob")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
RDZV_KEYS = ("backend", "host", "port", "min_replicas")
PVC_SCHEME = "pvc://"


def check_job_name(name: str, instance_count: int) -> None:
    """DNS-1035 (the operator's admission rule), short enough for its pods' and services' names."""
    longest = f"{name}{WORKER_SUFFIX}{max(instance_count - 2, 0)}"
    if not DNS_1035.match(name) or len(longest) > MAX_NAME:
        raise ConfigError(
            f"job_name={name!r} is not a valid Kubernetes job name: lower-case letters, digits "
            f"and '-', starting with a letter and ending with a letter or digit (DNS-1035), "
            f"with its pod names ('{longest}', {len(longest)} characters) at most {MAX_NAME} "
            "characters. Example: 'llama-fsdp-1'.")


def check_group_names(job_name: str, groups: int, per_group: int, lighthouse: str) -> None:
    """A fault-tolerant job's PyTorchJobs (<job>-group-<g>) and lighthouse name their pods and
    Services after the job: all must stay DNS-1035 labels of at most 63 characters."""
    longest = f"{job_name}-group-{groups - 1}{WORKER_SUFFIX}{max(per_group - 2, 0)}"
    for name in (longest, lighthouse):  # the lighthouse's Service name is a DNS-1035 label
        if len(name) > MAX_NAME:
            raise ConfigError(
                f"job_name={job_name!r} is too long for a fault-tolerant Kubernetes job: its "
                f"names ('{name}', {len(name)} characters) must be at most {MAX_NAME} "
                f"characters. Use a job_name of at most {len(job_name) - len(name) + MAX_NAME} "
                "characters.")


def check_namespace(namespace: Any) -> str:
    if not isinstance(namespace, str) or not DNS_1035.match(namespace) or len(namespace) > 63:
        raise ConfigError(f"namespace={namespace!r} is not a Kubernetes namespace name "
                          "(DNS-1035 label, e.g. 'default' or 'training').")
    return namespace


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise ConfigError(f"kind={kind!r} is not rendered: use 'PyTorchJob' (Kubeflow training "
                          "operator v1) or 'TrainJob' (Kubeflow Trainer v2).")
    return kind


def pvc_mount(uri: str, what: str) -> tuple[str, str]:
    """(claim name, sub path) of ``pvc://claim[/sub/path]``; ConfigError for other URIs."""
    if not uri.startswith(PVC_SCHEME):
        raise ConfigError(
            f"{what}={uri!r}: Kubernetes pods read channels and write outputs on volumes: give a "
            "PersistentVolumeClaim as 'pvc://<claim-name>[/sub/path]' (S3 and local paths are "
            "not mounted into pods; a script may still read S3 itself).")
    claim, _, sub_path = uri[len(PVC_SCHEME):].partition("/")
    if not DNS_1123_SUBDOMAIN.match(claim) or len(claim) > 253:
        raise ConfigError(f"{what}={uri!r}: {claim!r} is not a PersistentVolumeClaim name "
                          "(lower-case DNS-1123 subdomain).")
    if ".." in sub_path.split("/"):
        raise ConfigError(f"{what}={uri!r}: the sub path may not contain '..'.")
    return claim, sub_path.strip("/")


def check_spec(spec: JobSpec, *, gpus: int, processes: int) -> None:
    """Refuse what a pod cannot honour, with the reason and the fix."""
    check_job_name(spec.job_name, spec.instance_count)
    if not spec.image_uri:
        raise ConfigError("Kubernetes pods run an image: pass image_uri= (an image with python3, "
                          "torch and meshtrain's runtime, e.g. one built from containers/).")
    if gpus and processes > gpus:
        raise ConfigError(
            f"processes_per_host={processes} exceeds the {gpus} GPUs of {spec.instance_type}: "
            f"each process needs a GPU of its own. Use at most {gpus}.")
    for name in ("checkpoint_s3_uri", "max_wait"):
        if getattr(spec, name):
            raise ConfigError(f"{name} is a SageMaker setting that Kubernetes jobs do not "
                              "honour: remove it (checkpoints go to checkpoint_local_path on "
                              "a volume).")
    if spec.use_spot_instances:
        raise ConfigError("use_spot_instances is a SageMaker setting: on Kubernetes choose spot "
                          "nodes through the node group, not the job.")
    for channel, uri in spec.inputs.items():
        pvc_mount(uri, f"input channel {channel!r}")
    if spec.output_path:
        pvc_mount(spec.output_path, "output_path")


def check_rendezvous(backend: Any, rendezvous: dict[str, Any]) -> None:
    """An elastic rendezvous the bootstrap can join."""
    unknown = sorted(set(rendezvous) - set(RDZV_KEYS))
    if unknown:
        raise ConfigError(f"rendezvous keys {unknown} are unknown; use {', '.join(RDZV_KEYS)}.")
    if backend not in RDZV_BACKENDS:
        raise ConfigError(f"rendezvous backend {backend!r} is not one of "
                          f"{', '.join(RDZV_BACKENDS)}.")
    for key in ("port", "min_replicas"):
        value = rendezvous.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ConfigError(f"rendezvous {key}={value!r} must be a non-negative int.")
    if "etcd" in backend and not rendezvous.get("host"):
        raise ConfigError("an etcd rendezvous needs host= (the etcd service's name, e.g. "
                          "'etcd.kubeflow'): meshtrain does not start etcd in the job.")
