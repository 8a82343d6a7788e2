"""Submit, status, logs, stop and attach through the real `kubernetes` client, against an API
server faked at the HTTP boundary (fake_apiserver.py) that validates what it receives."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from meshtrain import Estimator, JobFailedError
from meshtrain.backends.kubernetes.backend import KubernetesBackend
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.metrics import format_metric_line

pytest.importorskip("kubernetes")

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:0.1"


def metric_log(host: str, step: int, loss: float) -> str:
    return f"[{host} rank 0] " + format_metric_line("train:loss", loss, step) + "\n"


def test_submit_creates_a_valid_job_and_its_config_map(server, estimator):
    job = estimator.fit(job_name="llama-k8s", wait=False)
    objects = server.cluster.objects
    assert ("configmaps", "training", "llama-k8s-config") in objects
    stored = objects[("pytorchjobs", "training", "llama-k8s")]  # the server validated it
    assert stored["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert job.describe()["TrainingJobStatus"] == "InProgress"
    server.cluster.set_conditions("training", "llama-k8s", ("Created", ""), ("Running", ""))
    assert job.describe()["SecondaryStatus"] == "Running"
    spec = estimator.backend.load_spec("llama-k8s")  # attach's source: the spec in the ConfigMap
    assert spec == estimator.build_spec(job_name="llama-k8s")


def test_wait_shows_the_pods_logs_and_progress_then_completes(server, estimator, capsys):
    job = estimator.fit(job_name="done-job", wait=False)
    server.cluster.add_pod("training", "done-job-worker-0", "done-job", "[algo-2 rank 9] hi\n")
    server.cluster.add_pod("training", "done-job-master-0", "done-job",
                           metric_log("algo-1", 9, 0.5) + "[algo-1 rank 0] saved\n")
    server.cluster.set_conditions("training", "done-job", ("Running", ""), ("Succeeded", "ok"))
    job.wait()
    out = capsys.readouterr().out.splitlines()
    assert out.index("[algo-1 rank 0] saved") < out.index("[algo-2 rank 9] hi")  # master first
    assert any(line.startswith("[meshtrain] done-job: step 9/10 · loss 0.5000 · ran ")
               for line in out)
    assert job.describe()["TrainingJobStatus"] == "Completed"


def test_a_failed_job_raises_with_the_operators_message(server, estimator):
    job = estimator.fit(job_name="bad-job", wait=False)
    server.cluster.set_conditions("training", "bad-job", ("Running", ""),
                                  ("Failed", "PyTorchJob bad-job has failed because 1 Worker "
                                             "replica(s) failed."))
    with pytest.raises(JobFailedError, match="1 Worker replica"):
        job.wait(logs=False)


def test_stop_deletes_the_job_its_pods_and_config_map(server, estimator, capsys):
    job = estimator.fit(job_name="stop-me", wait=False)
    server.cluster.add_pod("training", "stop-me-master-0", "stop-me", "running\n")
    job.stop()
    assert not [key for key in server.cluster.objects if "stop-me" in key[2]]
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert ("DELETE", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/stop-me") in \
        server.cluster.requests


def test_a_taken_name_is_a_config_error_and_nothing_is_changed(server, estimator):
    estimator.fit(job_name="twice", wait=False)
    before = copy.deepcopy(server.cluster.objects)
    with pytest.raises(ConfigError, match="already exists"):
        estimator.fit(job_name="twice", wait=False)
    assert server.cluster.objects == before


def test_bad_input_sends_no_request(server, estimator):
    with pytest.raises(ConfigError, match="DNS-1035"):
        estimator.fit(job_name="Upper", wait=False)
    with pytest.raises(ConfigError, match="not honoured by Kubernetes jobs"):
        Estimator("train.py", source_dir=str(Path(estimator.source_dir)),
                  instance_type="k8s:ml.p4d.24xlarge", image_uri=IMAGE, jobs_dir="/tmp/x")
    assert server.cluster.requests == []


def test_a_rejected_job_leaves_no_config_map(server, estimator):
    backend = KubernetesBackend(namespace="training", api_client=estimator.backend.api_client)
    spec = estimator.build_spec(job_name="rejected")
    config_map, job = backend.render(spec)
    job["spec"]["unknownField"] = True  # the server's schema check answers 422
    backend.render = lambda _spec: [config_map, job]
    with pytest.raises(Exception, match=r"\(422\)"):
        backend.submit(spec)
    assert ("configmaps", "training", "rejected-config") not in server.cluster.objects
