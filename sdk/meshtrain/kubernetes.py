"""Kubernetes manifests for kubectl users: an Estimator as a Kubeflow PyTorchJob or TrainJob.

    from meshtrain import Estimator
    from meshtrain import kubernetes

    estimator = Estimator("train.py", source_dir="src", instance_type="ml.p4d.24xlarge",
                          instance_count=2, image_uri="...", distribution={...})
    job = kubernetes.render(estimator, job_name="llama-fsdp", namespace="training")
    print(kubernetes.to_yaml(kubernetes.render_all(estimator, job_name="llama-fsdp")))

No cluster and no Kubernetes client are needed; see docs/kubernetes.md.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from meshtrain.backends.kubernetes.checks import check_job_name
from meshtrain.backends.kubernetes.render import render_spec
from meshtrain.contract.errors import ConfigError

if TYPE_CHECKING:
    from meshtrain.estimator import Estimator


def render_all(estimator: Estimator, *, job_name: str, namespace: str = "default",
               kind: str = "PyTorchJob", inputs: Any = None, code_in_image: bool = False,
               rendezvous: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """[ConfigMap, job]: the job's /opt/ml contract (and code) and the job that runs it.
    `rendezvous` asks for an elastic PyTorchJob, e.g. ``{"backend": "etcd-v2", "host":
    "etcd.kubeflow", "min_replicas": 2}`` (docs/kubernetes.md); the distribution's
    ``torch_distributed.max_restarts`` becomes its maxRestarts."""
    if not isinstance(job_name, str):
        raise ConfigError(f"job_name must be a string, got {job_name!r}.")
    check_job_name(job_name, estimator.instance_count)  # Kubernetes' rule before SageMaker's
    spec = estimator.build_spec(inputs, job_name=job_name)
    return render_spec(spec, namespace=namespace, kind=kind, code_in_image=code_in_image,
                       rendezvous=rendezvous)


def render(estimator: Estimator, *, job_name: str, namespace: str = "default",
           kind: str = "PyTorchJob", inputs: Any = None, code_in_image: bool = False,
           rendezvous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PyTorchJob (or TrainJob) object alone; it needs the ConfigMap `render_all` adds.
    A fault-tolerant job is several objects (a job per replica group and a lighthouse): refused
    here, `render_all` returns them."""
    objects = render_all(estimator, job_name=job_name, namespace=namespace, kind=kind,
                         inputs=inputs, code_in_image=code_in_image, rendezvous=rendezvous)
    if len(objects) != 2:
        kinds = ", ".join(obj["kind"] for obj in objects[1:])
        raise ConfigError(
            f"job {job_name!r} renders {len(objects) - 1} objects besides its ConfigMap ({kinds}: "
            "torch_distributed.fault_tolerance runs a job per replica group and a lighthouse), "
            "not one job. Use kubernetes.render_all(...) and apply every object."
        )
    return objects[1]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """A multi-document manifest for `kubectl apply -f`. Each document is JSON, which is YAML:
    no YAML library is needed and the output is exact (no implicit typing of strings)."""
    return "".join(f"---\n{json.dumps(obj, indent=2, sort_keys=True)}\n" for obj in objects)
