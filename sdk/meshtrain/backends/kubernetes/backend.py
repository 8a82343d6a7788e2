"""Jobs on a Kubernetes cluster with the Kubeflow training operator, through the official
`kubernetes` client (`pip install 'meshtrain[k8s]'`).

`instance_type="k8s:ml.p4d.24xlarge"` runs on nodes of that type; backend options `namespace`,
`kube_context`, `kubeconfig`, `kind` ("PyTorchJob" or "TrainJob") and `code_in_image` choose
where and how. submit() creates the ConfigMap (which also keeps the JobSpec, for attach) and the
job; the handle maps the job's conditions to DescribeTrainingJob's statuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshtrain.backends import BackendUnreachable
from meshtrain.backends.kubernetes.handle import (
    SPEC_KEY,
    KubernetesTrainingJob,
    describe_job,
    job_api,
)
from meshtrain.backends.kubernetes.render import render_spec
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.support import check_fault_tolerance_supported

if TYPE_CHECKING:
    from meshtrain.targets import Target


def _client_module() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ConfigError("Kubernetes jobs need the kubernetes client: pip install "
                          "'meshtrain[k8s]' (or render a manifest with `meshtrain k8s render`, "
                          "which needs nothing).") from None
    return kubernetes

LOOKUP_SECONDS = 10
OPTIONS = frozenset({"namespace", "kube_context", "kubeconfig", "kind", "code_in_image",
                     "api_client"})
"""The backend options Kubernetes jobs take (meshtrain.targets reads them from here)."""


class KubernetesBackend:
    """Submit to, and find jobs on, one namespace of one cluster."""

    name = "kubernetes"

    def __init__(self, target: Target | None = None, namespace: str = "default",
                 kube_context: str | None = None, kubeconfig: str | None = None,
                 kind: str = "PyTorchJob", code_in_image: bool = False,
                 api_client: Any = None) -> None:
        self.target = target
        self.namespace, self.kind, self.code_in_image = namespace, kind, code_in_image
        self._context, self._kubeconfig, self._api_client = kube_context, kubeconfig, api_client

    @property
    def api_client(self) -> Any:
        """The client, loaded from the kubeconfig on first use (not at construction)."""
        if self._api_client is None:
            kubernetes = _client_module()
            self._api_client = kubernetes.config.new_client_from_config(
                config_file=self._kubeconfig, context=self._context)
        return self._api_client

    def render(self, spec: JobSpec) -> list[dict[str, Any]]:
        objects = render_spec(spec, namespace=self.namespace, kind=self.kind,
                              code_in_image=self.code_in_image, target=self.target)
        objects[0]["data"][SPEC_KEY] = spec.to_record_json()  # the record: values masked
        return objects

    def validate(self, spec: JobSpec) -> None:
        self.render(spec)  # every check runs; nothing is sent
        fault_tolerance = spec.distribution_config().torch_distributed.fault_tolerance
        check_fault_tolerance_supported(
            fault_tolerance.replica_groups if fault_tolerance else None,
            "Kubernetes through fit()/submit",
            f"this build renders its {fault_tolerance and fault_tolerance.replica_groups} "
            "PyTorchJobs (one per replica group) and torchft's lighthouse Deployment and "
            "Service, but does not create or follow them: render them with `meshtrain k8s "
            "render` (or meshtrain.kubernetes.render_all) and `kubectl apply -f` the output")

    def submit(self, spec: JobSpec) -> KubernetesTrainingJob:
        self.validate(spec)  # refuses what submit cannot create, before any request
        config_map, job = self.render(spec)
        kubernetes = _client_module()
        core = kubernetes.client.CoreV1Api(self.api_client)
        try:
            core.create_namespaced_config_map(self.namespace, config_map)
        except kubernetes.client.ApiException as error:
            if error.status == 409:
                raise ConfigError(f"a job named {spec.job_name!r} already exists in namespace "
                                  f"{self.namespace!r} (its ConfigMap {spec.job_name}-config): "
                                  "choose another job_name.") from None
            raise
        group, version, plural = job_api(self.kind)
        try:
            kubernetes.client.CustomObjectsApi(self.api_client).create_namespaced_custom_object(
                group, version, self.namespace, plural, job)
        except kubernetes.client.ApiException:
            core.delete_namespaced_config_map(config_map["metadata"]["name"], self.namespace)
            raise
        return self.attach(spec.job_name)

    def attach(self, job_name: str) -> KubernetesTrainingJob:
        return KubernetesTrainingJob(job_name, self.namespace, self.kind, self.api_client)

    def load_spec(self, job_name: str) -> JobSpec:
        return self.attach(job_name).spec()

    # --- the job registry -------------------------------------------------------------------

    def find(self, job_name: str) -> KubernetesTrainingJob | None:
        """The job `job_name` of this namespace, None if it has none; BackendUnreachable
        without the client, without a kubeconfig, or when the API server does not answer."""
        kubernetes = self._reachable_client()
        group, version, plural = job_api(self.kind)
        try:
            kubernetes.client.CustomObjectsApi(self.api_client).get_namespaced_custom_object(
                group, version, self.namespace, plural, job_name, _request_timeout=LOOKUP_SECONDS)
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise BackendUnreachable(f"the API server refused the lookup ({error.status} "
                                     f"{error.reason})") from None
        except Exception as error:  # urllib3's connection errors: the cluster is not there
            raise BackendUnreachable(f"the API server did not answer: {error}") from None
        return self.attach(job_name)

    def job_names(self) -> list[str]:
        """The names of this namespace's jobs of this kind."""
        return [row["TrainingJobName"] for row in self.summaries()]

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """This namespace's jobs of this kind, newest first, as DescribeTrainingJob shapes."""
        kubernetes = self._reachable_client()
        group, version, plural = job_api(self.kind)
        try:
            listed = kubernetes.client.CustomObjectsApi(
                self.api_client).list_namespaced_custom_object(
                group, version, self.namespace, plural, _request_timeout=LOOKUP_SECONDS)
        except Exception as error:  # refused or not there
            raise BackendUnreachable(f"the API server did not answer: {error}") from None
        rows = [describe_job(item) for item in listed.get("items", [])]
        rows.sort(key=lambda row: row.get("CreationTime") or "", reverse=True)
        return rows[:limit]

    def not_found(self, job_name: str) -> str:
        return f"no Kubernetes {self.kind} {job_name} in namespace {self.namespace}"

    def _reachable_client(self) -> Any:
        """The client module once a kubeconfig has loaded; BackendUnreachable otherwise."""
        try:
            kubernetes = _client_module()
        except ConfigError:
            raise BackendUnreachable("the kubernetes client is not installed "
                                     "(pip install 'meshtrain[k8s]')") from None
        try:
            self.api_client  # noqa: B018 - loads the kubeconfig
        except Exception as error:  # kubernetes.config.ConfigException, a missing file
            raise BackendUnreachable(f"no kubeconfig ({error}): set KUBECONFIG or pass "
                                     "--kubeconfig") from None
        return kubernetes
