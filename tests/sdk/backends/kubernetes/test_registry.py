"""A finished Kubernetes job found by name through the job registry, against the fake API
server: Estimator.attach and `meshtrain status|describe|logs|stop|list`; a kubeconfig pointing
at a cluster that does not answer is named in the not-found message."""

from __future__ import annotations

import json
import socket

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.backends.kubernetes.handle import KubernetesTrainingJob
from meshtrain.cli import main

pytest.importorskip("kubernetes")


@pytest.fixture
def no_aws(tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))


def test_a_finished_kubernetes_job_by_name(server, estimator, kubeconfig, no_aws, capsys):
    estimator.fit(job_name="k8s-done", wait=False)
    server.cluster.add_pod("training", "k8s-done-master-0", "k8s-done",
                           "[algo-1 rank 0] hello from a pod\n")
    server.cluster.set_conditions("training", "k8s-done", ("Running", ""), ("Succeeded", "ok"))
    where = {"namespace": "training", "kubeconfig": str(kubeconfig), "kube_context": "fake"}

    attached = Estimator.attach("k8s-done", **where)
    assert isinstance(attached.latest_training_job, KubernetesTrainingJob)
    assert attached.instance_type == "k8s:ml.p4d.24xlarge" and attached.instance_count == 2
    flags = ["--namespace", "training", "--kubeconfig", str(kubeconfig), "--kube-context", "fake"]
    capsys.readouterr()
    assert main(["status", "k8s-done", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobStatus"] == "Completed"
    assert main(["describe", "k8s-done", *flags]) == 0
    view = capsys.readouterr().out.splitlines()
    assert "Status:    Completed (Succeeded)" in view
    assert any(line.startswith("Script:    ") for line in view)  # from the spec in its ConfigMap
    assert main(["logs", "k8s-done", "-f", *flags]) == 0
    assert capsys.readouterr().out.splitlines() == ["[algo-1 rank 0] hello from a pod",
                                                    "===== Job Completed ====="]
    assert main(["list", "--kubernetes", *flags]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT", "REASON"]
    assert rows[1].split()[:2] == ["k8s-done", "Completed"]
    assert main(["stop", "k8s-done", *flags]) == 0
    assert "already ended (Completed)" in capsys.readouterr().out
    assert ("pytorchjobs", "training", "k8s-done") in server.cluster.objects  # not deleted
    assert main(["status", "k8s-dne", *flags]) == 2
    err = capsys.readouterr().err
    assert "no Kubernetes PyTorchJob k8s-dne in namespace training" in err
    assert err.rstrip().endswith("Did you mean 'k8s-done'?")


def test_a_cluster_that_does_not_answer_is_skipped_and_named(no_aws, tmp_path):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    config = tmp_path / "dead-kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": dead}}],
        "users": [{"name": "tester", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "tester"}}]}))
    with pytest.raises(ConfigError) as error:
        Estimator.attach("anything", namespace="training", kubeconfig=str(config))
    message = str(error.value)
    assert message.startswith(f"no local job anything under {tmp_path}/home/jobs")
    assert "; not searched: " in message
    assert "Kubernetes (the API server did not answer" in message and f"port={port}" in message
