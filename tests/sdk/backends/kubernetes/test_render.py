"""Rendered PyTorchJob / TrainJob manifests validate strictly against the Kubeflow CRDs and the
operator's admission rules; bad input is a ConfigError before anything is rendered."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from meshtrain import Estimator, kubernetes
from meshtrain.cli import main
from meshtrain.contract.errors import ConfigError

from .crd import validate

SMP = {"torch_distributed": {"enabled": True},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 8, "tensor_parallel_degree": 2}}}}


@pytest.fixture
def source(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('training')\n")
    return src


def estimator(source: Path, **overrides) -> Estimator:
    arguments = {"entry_point": "train.py", "source_dir": str(source),
                 "instance_type": "ml.p4d.24xlarge", "instance_count": 2,
                 "image_uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:0.1",
                 "distribution": SMP, "hyperparameters": {"max_steps": 100},
                 "environment": {"NCCL_DEBUG": "WARN"}, **overrides}
    return Estimator(**arguments)


def test_pytorchjob_validates_and_carries_the_job(source):
    config_map, job = kubernetes.render_all(
        estimator(source), job_name="llama-fsdp", namespace="training",
        inputs={"train": "pvc://datasets/llama/train"})
    validate(job)
    spec = job["spec"]
    assert spec["nprocPerNode"] == "8"
    master, worker = spec["pytorchReplicaSpecs"]["Master"], spec["pytorchReplicaSpecs"]["Worker"]
    assert (master["replicas"], worker["replicas"]) == (1, 1)
    pod = master["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/opt/ml/input/data/train"]["subPath"] == "llama/train"
    assert mounts["/opt/ml/input/config"]["readOnly"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["MESHTRAIN_MASTER_ADDR"]["value"] == "llama-fsdp-master-0"
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert "training.kubeflow.org/replica-index" in json.dumps(env["MESHTRAIN_REPLICA_INDEX"])
    assert job["metadata"]["labels"]["meshtrain.io/job-name"] == "llama-fsdp"
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 24 * 60 * 60
    hyperparameters = json.loads(config_map["data"]["hyperparameters.json"])
    assert json.loads(hyperparameters["mp_parameters"]) == SMP["smdistributed"]["modelparallel"][
        "parameters"]
    assert json.loads(hyperparameters["max_steps"]) == 100
    assert "current_host" not in json.loads(config_map["data"]["resourceconfig.json"])
    archive = base64.b64decode(config_map["binaryData"]["sourcedir.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.getnames() == ["train.py"]


def test_trainjob_validates(source):
    job = kubernetes.render(estimator(source, instance_count=4), job_name="llama-v2",
                            kind="TrainJob")
    validate(job)
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"


def test_one_host_has_no_workers_and_cpu_types_ask_for_no_gpu(source):
    job = kubernetes.render(
        estimator(source, instance_type="ml.m5.xlarge", instance_count=1,
                  distribution={"torch_distributed": {"enabled": True, "processes_per_host": 2}}),
        job_name="cpu-job", code_in_image=True)
    validate(job)
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert "resources" not in container and job["spec"]["nprocPerNode"] == "2"


@pytest.mark.parametrize("break_it, message", [
    (lambda job: job["spec"].update(unknownField=1), "Additional properties"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"].update(Chief={"replicas": 1}),
     "only Master and Worker"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
     "exactly one Master"),
    (lambda job: job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
     .update(name="main"), "container named 'pytorch'"),
    (lambda job: job["metadata"].update(name="Llama_1"), "DNS-1035"),
])
def test_the_validator_catches_a_broken_manifest(source, break_it, message):
    job = kubernetes.render(estimator(source), job_name="llama-fsdp")
    break_it(job)
    with pytest.raises((jsonschema.ValidationError, AssertionError), match=message):
        validate(job)


BAD_INPUTS = {
    "upper-case-name": ({}, {"job_name": "Llama"}, "DNS-1035"),
    "name-starts-with-digit": ({}, {"job_name": "1llama"}, "DNS-1035"),
    "name-too-long-for-pods": ({}, {"job_name": "a" * 60}, "at most 63"),
    "namespace": ({}, {"namespace": "Team_A"}, "namespace"),
    "kind": ({}, {"kind": "MPIJob"}, "kind='MPIJob'"),
    "no-image": ({"image_uri": None}, {}, "image_uri"),
    "local-type": ({"instance_type": "local", "distribution": None}, {}, "ml.*"),
    "unknown-gpu-type": ({"instance_type": "ml.p9.48xlarge"}, {}, "Unknown instance type"),
    "more-processes-than-gpus": (
        {"instance_type": "ml.g5.12xlarge", "distribution": {
            "torch_distributed": {"enabled": True, "processes_per_host": 8}}}, {}, "4 GPUs"),
    "s3-input": ({}, {"inputs": {"train": "s3://bucket/train"}}, "PersistentVolumeClaim"),
    "local-input": ({}, {"inputs": {"train": "/data/train"}}, "PersistentVolumeClaim"),
    "bad-claim": ({}, {"inputs": {"train": "pvc://Bad_Claim/x"}}, "not a PersistentVolumeClaim"),
    "dotdot-subpath": ({}, {"inputs": {"train": "pvc://data/../etc"}}, "'..'"),
    "s3-output": ({"output_path": "s3://bucket/out"}, {}, "output_path"),
    "checkpoint-s3": ({"checkpoint_s3_uri": "s3://bucket/ckpt"}, {}, "checkpoint_s3_uri"),
    "spot": ({"use_spot_instances": True, "max_wait": 90000}, {}, "max_wait"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_a_config_error_before_rendering(source, case):
    overrides, render_arguments, message = BAD_INPUTS[case]
    arguments = {"job_name": "llama-fsdp", **render_arguments}
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        kubernetes.render_all(estimator(source, **overrides), **arguments)


def test_code_too_large_for_a_config_map_says_how_to_ship_it(source):
    (source / "weights.bin").write_bytes(os.urandom(1024 * 1024))
    with pytest.raises(ConfigError, match="code_in_image=True"):
        kubernetes.render_all(estimator(source), job_name="big-code")
    job = kubernetes.render(estimator(source), job_name="big-code", code_in_image=True)
    validate(job)


def test_cli_prints_a_manifest_kubectl_reads(source, capsys):
    assert main(["k8s", "render", "train.py", "--source-dir", str(source), "--instance-type",
                 "ml.p5.48xlarge", "--instance-count", "2", "--image", "repo/meshtrain:0.1",
                 "--job-name", "cli-job", "--distribution", json.dumps(SMP)]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in documents] == ["ConfigMap", "PyTorchJob"]
    validate(documents[1])
    limits = documents[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert main(["k8s", "render", "train.py", "--source-dir", str(source), "--instance-type",
                 "ml.p5.48xlarge", "--image", "x", "--job-name", "Bad_Name"]) == 2
    assert "DNS-1035" in capsys.readouterr().err


def test_an_elastic_rendezvous_renders_an_elastic_policy(source):
    restarting = {"torch_distributed": {"enabled": True, "max_restarts": 3}}
    job = kubernetes.render(estimator(source, instance_count=4, distribution=restarting),
                            job_name="elastic",
                            rendezvous={"backend": "etcd-v2", "host": "etcd.kubeflow",
                                        "min_replicas": 2})
    validate(job)
    assert job["spec"]["elasticPolicy"] == {
        "rdzvBackend": "etcd-v2", "rdzvHost": "etcd.kubeflow", "rdzvPort": 2379,
        "rdzvId": "elastic", "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 3}
    c10d = kubernetes.render(estimator(source), job_name="c10d", rendezvous={"backend": "c10d"})
    validate(c10d)
    assert (c10d["spec"]["elasticPolicy"]["rdzvHost"],
            c10d["spec"]["elasticPolicy"]["rdzvPort"]) == ("c10d-master-0", 29400)
    assert c10d["spec"]["elasticPolicy"]["maxRestarts"] == 0
    static = kubernetes.render(estimator(source), job_name="static")
    assert "elasticPolicy" not in static["spec"]
    # restarts alone: the hosts need a rendezvous they can meet again in, c10d by default
    restarted = kubernetes.render(estimator(source, distribution=restarting), job_name="again")
    validate(restarted)
    assert (restarted["spec"]["elasticPolicy"]["rdzvBackend"],
            restarted["spec"]["elasticPolicy"]["maxRestarts"]) == ("c10d", 3)


@pytest.mark.parametrize("rendezvous, kind, message", [
    ({"backend": "zookeeper"}, "PyTorchJob", "not one of"),
    ({"backend": "etcd"}, "PyTorchJob", "needs host="),
    ({"backend": "c10d", "min_replicas": 3}, "PyTorchJob", "between 1 and instance_count=2"),
    ({"backend": "c10d", "port": "80"}, "PyTorchJob", "non-negative int"),
    ({"backend": "c10d", "hosts": "x"}, "PyTorchJob", "unknown"),
    ({"backend": "c10d"}, "TrainJob", "PyTorchJob only"),
    ({"backend": "c10d", "max_restarts": 2}, "PyTorchJob", "unknown"),
])
def test_a_rendezvous_the_pods_cannot_join_is_a_config_error(source, rendezvous, kind, message):
    with pytest.raises(ConfigError, match=message):
        kubernetes.render(estimator(source), job_name="elastic", kind=kind,
                          rendezvous=rendezvous)


def test_max_restarts_is_refused_where_it_cannot_be_honoured(source, tmp_path):
    restarting = {"torch_distributed": {"enabled": True, "max_restarts": 2}}
    with pytest.raises(ConfigError, match="a TrainJob's runtime owns its restarts"):
        kubernetes.render(estimator(source, distribution=restarting), job_name="t",
                          kind="TrainJob")
