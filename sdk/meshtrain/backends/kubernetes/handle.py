"""The handle of a Kubernetes job: status from the job's conditions in DescribeTrainingJob's
shape, logs of its pods merged (master first), stop() deletes the job and its ConfigMap."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from meshtrain.backends.kubernetes.pods import JOB_LABEL
from meshtrain.contract.jobspec import JobSpec
from meshtrain.display import host_index, make_display
from meshtrain.job import TERMINAL_STATUSES, TrainingJob, reported_interrupt
from meshtrain.job_layout import layout_of_spec
from meshtrain.progress import total_steps_from

POLL_SECONDS = 2.0
SPEC_KEY = "meshtrain-jobspec.json"
"""The JobSpec a job was submitted from, kept in its ConfigMap (for attach and progress)."""
# Kubeflow job condition -> DescribeTrainingJob status; the last true condition wins.
CONDITION_STATUS = {"Created": "InProgress", "Running": "InProgress",
                    "Restarting": "InProgress", "Succeeded": "Completed", "Failed": "Failed",
                    "Complete": "Completed"}


def job_api(kind: str) -> tuple[str, str, str]:
    """(group, version, plural) of the custom resource."""
    if kind == "TrainJob":
        return "trainer.kubeflow.org", "v1alpha1", "trainjobs"
    return "kubeflow.org", "v1", "pytorchjobs"


def describe_job(job: dict[str, Any]) -> dict[str, Any]:
    """DescribeTrainingJob's fields from a PyTorchJob/TrainJob object."""
    status = job.get("status") or {}
    true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    known = [c for c in true if c.get("type") in CONDITION_STATUS]
    last = known[-1] if known else None
    described: dict[str, Any] = {
        "TrainingJobName": job["metadata"]["name"],
        "TrainingJobStatus": CONDITION_STATUS[last["type"]] if last else "InProgress",
        "SecondaryStatus": last["type"] if last else "Pending",
        "CreationTime": job["metadata"].get("creationTimestamp"),
    }
    if status.get("startTime"):
        described["TrainingStartTime"] = status["startTime"]
    if status.get("completionTime"):
        described["TrainingEndTime"] = status["completionTime"]
    if described["TrainingJobStatus"] == "Failed":
        described["FailureReason"] = last.get("message") or last.get("reason") or "job failed"
    return described


class KubernetesTrainingJob(TrainingJob):
    """A job in one namespace; every call asks the API server."""

    def __init__(self, job_name: str, namespace: str, kind: str, api_client: Any) -> None:
        super().__init__(job_name)
        self.namespace, self.kind, self.api_client = namespace, kind, api_client
        self._stopped = False
        self._layout: dict[str, Any] | None = None

    def _apis(self) -> tuple[Any, Any, Any]:
        import kubernetes

        client = kubernetes.client
        return client, client.CoreV1Api(self.api_client), client.CustomObjectsApi(self.api_client)

    def describe(self) -> dict[str, Any]:
        client, _, custom = self._apis()
        group, version, plural = job_api(self.kind)
        try:
            job = custom.get_namespaced_custom_object(group, version, self.namespace, plural,
                                                      self.job_name)
        except client.ApiException as error:
            if error.status == 404 and self._stopped:
                return {"TrainingJobName": self.job_name, "TrainingJobStatus": "Stopped",
                        "SecondaryStatus": "Stopped"}
            raise
        layout = self.layout()
        return {**describe_job(job), "Layout": layout} if layout else describe_job(job)

    def layout(self) -> dict[str, Any] | None:
        """describe()["Layout"] (meshtrain.job_layout) from the job's JobSpec, read once; None
        without its ConfigMap (a job applied by hand from other manifests)."""
        if self._layout is None:
            client, _, _ = self._apis()
            try:
                self._layout = layout_of_spec(self.spec())
            except client.ApiException as error:
                if error.status != 404:
                    raise
        return self._layout

    def log_location(self) -> str:
        return f"kubectl logs -n {self.namespace} -l {JOB_LABEL}={self.job_name}"

    def _pods(self) -> list[Any]:
        _, core, _ = self._apis()
        pods = core.list_namespaced_pod(self.namespace,
                                        label_selector=f"{JOB_LABEL}={self.job_name}").items
        return sorted(pods, key=lambda pod: (not pod.metadata.name.endswith("-master-0"),
                                             pod.metadata.name))

    def log_lines(self) -> Iterator[str]:
        """Every pod's log, the master's first (each line carries its [algo-N rank R])."""
        _, core, _ = self._apis()
        for pod in self._pods():
            # Raw bytes, decoded here: the client's own decoding of text/plain bodies differs
            # between versions (some return the repr of the bytes).
            response = core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                    _preload_content=False)
            yield from response.data.decode("utf-8", errors="replace").splitlines()

    def logs(self) -> None:
        for line in self.log_lines():
            print(line)

    def spec(self) -> JobSpec:
        """The JobSpec this job was submitted from (kept in its ConfigMap)."""
        _, core, _ = self._apis()
        config_map = core.read_namespaced_config_map(f"{self.job_name}-config", self.namespace)
        return JobSpec.model_validate(json.loads(config_map.data[SPEC_KEY]))

    def wait(self, logs: bool = True) -> None:
        display = make_display(self.job_name, total_steps=total_steps_from(
            self.spec().hyperparameters), header=self.start_line()) if logs else None
        try:
            description = self._follow(display)
        except KeyboardInterrupt:
            if display is not None:
                display.close()
            raise reported_interrupt(
                f"stopped following job {self.job_name}; it keeps running in namespace "
                f"{self.namespace} (stop it: meshtrain stop {self.job_name}).") from None
        if display is not None:
            display.close()
        self.raise_for_status(description)

    def _follow(self, display: Any) -> dict[str, Any]:
        """Poll until the job ends, showing new log lines and the status meanwhile."""
        shown = 0
        while True:
            description = self.describe()
            if display is not None:
                lines = list(self.log_lines())
                for line in lines[shown:]:
                    display.log(line, host=host_index(line))
                shown = len(lines)
                display.status(description["TrainingJobStatus"])
            if description["TrainingJobStatus"] in TERMINAL_STATUSES:
                return description
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """Delete the job (its pods go with it) and its ConfigMap."""
        client, core, custom = self._apis()
        group, version, plural = job_api(self.kind)
        for delete in (
                lambda: custom.delete_namespaced_custom_object(
                    group, version, self.namespace, plural, self.job_name,
                    propagation_policy="Foreground"),
                lambda: core.delete_namespaced_config_map(f"{self.job_name}-config",
                                                          self.namespace)):
            try:
                delete()
            except client.ApiException as error:
                if error.status != 404:
                    raise
        self._stopped = True
        print(f"Stopped training job {self.job_name} (deleted from {self.namespace}).")
