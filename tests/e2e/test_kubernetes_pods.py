"""The contract a rendered PyTorchJob gives its pods, run for real: two bootstraps that each see
only what their pod would (the ConfigMap's files, the code in the image's /opt/ml/code, the
container's env with its replica labels, the `train` channel's volume at
/opt/ml/input/data/train) train the quickstart on 2 hosts x 2 processes and end with the same
loss as the local-process job. The one change a pod does not need: the master's address is
127.0.0.1, as there is no cluster DNS for <job>-master-0 here."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from meshtrain import Estimator, kubernetes
from meshtrain.contract.metrics import parse_metric_records

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
CORPUS = QUICKSTART.parent / "data" / "corpus"  # the quickstart's `train` channel
# the channel as a PersistentVolumeClaim (mounted at /opt/ml/input/data/train); make_pod plays
# the mount with a link to the corpus
INPUTS = {"train": "pvc://corpus"}
DISTRIBUTION = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
                "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                    "hybrid_shard_degree": 2}}}}
HYPERPARAMETERS = {"steps": 6, "lr": 3e-3}

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


def last_loss(lines) -> float:
    losses = [r.value for line in lines for r in parse_metric_records(line)
              if r.name == "train:loss"]
    assert losses, "no train:loss metric line"
    return losses[-1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pod_environment(container: dict, base: Path, replica: tuple[str, str], port: int) -> dict:
    """The container's env as the kubelet would set it (downward API values filled in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "MESHTRAIN_"))}
    labels = {"training.kubeflow.org/replica-type": replica[0],
              "training.kubeflow.org/replica-index": replica[1]}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = labels[path.split("'")[1]]
    env.update(SAGEMAKER_BASE_DIR=str(base), MESHTRAIN_MASTER_ADDR="127.0.0.1",
               MESHTRAIN_MASTER_PORT=str(port), MESHTRAIN_NUM_GPUS="0", OMP_NUM_THREADS="1")
    return env


def make_pod(root: Path, name: str, config_map: dict, code: bytes) -> Path:
    """A pod's /opt/ml: the ConfigMap's files mounted, the code where the image keeps it, and
    the `train` volume where the PVC would be mounted."""
    base = root / name / "opt" / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    for key, text in config_map["data"].items():
        (config / key).write_text(text)
    assert set(json.loads(config_map["data"]["inputdataconfig.json"])) == set(INPUTS)
    (base / "input" / "data").mkdir()
    (base / "input" / "data" / "train").symlink_to(CORPUS, target_is_directory=True)
    with tarfile.open(fileobj=io.BytesIO(code)) as tar:
        tar.extractall(base / "code", filter="data")
    return base


def local_job_loss(jobs_dir: Path) -> float:
    """The quickstart's final loss as a local-process job (2 hosts x 2 processes)."""
    local = Estimator("train.py", source_dir=str(QUICKSTART), instance_count=2,
                      hyperparameters=HYPERPARAMETERS, distribution=DISTRIBUTION,
                      jobs_dir=str(jobs_dir))
    local.fit(inputs={"train": str(CORPUS)}, job_name="local-twin", logs=False)
    return last_loss(local.latest_training_job.log_lines())


def rendered_pods(job_name: str) -> tuple[dict, dict, bytes]:
    """(ConfigMap, the pods' container, the code archive) of the quickstart as a PyTorchJob on
    CPU nodes, the code baked into the image as /opt/ml/code."""
    cluster = Estimator("train.py", source_dir=str(QUICKSTART), instance_type="ml.m5.xlarge",
                        instance_count=2, image_uri="meshtrain:test", preflight=False,
                        hyperparameters=HYPERPARAMETERS, distribution=DISTRIBUTION)
    shipped, _ = kubernetes.render_all(cluster, job_name=job_name, inputs=INPUTS)
    code = base64.b64decode(shipped["binaryData"]["sourcedir.tar.gz"])
    config_map, job = kubernetes.render_all(cluster, job_name=job_name, code_in_image=True,
                                            inputs=INPUTS)
    assert job["spec"]["nprocPerNode"] == "2"
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return config_map, container, code


def test_rendered_pods_train_like_the_local_job(tmp_path):
    expected = local_job_loss(tmp_path / "jobs")
    config_map, container, code = rendered_pods("quickstart")
    port = free_port()
    pods = []
    for name, replica in (("master-0", ("master", "0")), ("worker-0", ("worker", "0"))):
        base = make_pod(tmp_path, name, config_map, code)
        pods.append(subprocess.Popen(
            [sys.executable, *container["command"][1:]], cwd=tmp_path,
            env=pod_environment(container, base, replica, port), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outputs = [pod.communicate(timeout=300)[0] for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    # Static rendezvous by node rank: had the worker taken itself for algo-1 too, two nodes
    # would have claimed rank 0 and the job could not have finished on both.
    for pod in ("master-0", "worker-0"):
        assert (tmp_path / pod / "opt" / "ml" / "output" / "success").is_file()
    assert last_loss(outputs[0].splitlines()) == pytest.approx(expected, abs=1e-5)
    model_dir = tmp_path / "master-0" / "opt" / "ml" / "model"
    assert (model_dir / "model.pt").is_file()
    assert json.loads((tmp_path / "master-0" / "opt" / "ml" / "output" / "data" /
                       "losses.json").read_text())["train:loss"][-1] == pytest.approx(
        expected, abs=1e-5)
