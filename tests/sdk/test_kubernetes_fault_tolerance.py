"""A fault-tolerant job on Kubernetes, rendered: one PyTorchJob per replica group (validated
against the Kubeflow CRD), each pod told its group, its job-wide host name and the lighthouse
Service; torchft's lighthouse as a Deployment and a Service (validated against the `kubernetes`
client's models, strictly: see test_the_model_check_fails_on_bad_objects). Nothing is launched;
submission through fit() is refused with the reason (docs/kubernetes.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from backends.kubernetes.crd import validate as validate_crd
from ci_guards import import_or_skip

from meshtrain import ConfigError, Estimator, kubernetes
from meshtrain.backends.kubernetes.backend import KubernetesBackend
from meshtrain.cli import main
from meshtrain.contract import env as names
from meshtrain.contract.fault_tolerance import read_replica_group_env
from meshtrain.contract.paths import OptMLPaths

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:0.1"
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
              "datetime": (str,), "date": (str,)}


def _distribution(groups: int = 2, shard: int = 16, max_restarts: int = 2, **ft: Any) -> dict:
    return {"torch_distributed": {"enabled": True, "max_restarts": max_restarts,
                                  "fault_tolerance": {"replica_groups": groups, **ft}},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": shard}}}}


def _estimator(tmp_path: Path, instance_count: int = 4, **distribution: Any) -> Estimator:
    (tmp_path / "train.py").write_text("print('training')\n")
    return Estimator("train.py", source_dir=str(tmp_path), instance_type="ml.p4d.24xlarge",
                     instance_count=instance_count, image_uri=IMAGE,
                     distribution=_distribution(**distribution))


def _render(tmp_path: Path, **distribution: Any) -> list[dict[str, Any]]:
    return kubernetes.render_all(_estimator(tmp_path, **distribution), job_name="llama-ft",
                                 namespace="training")


# --- a strict check against the kubernetes client's models ----------------------------------

def _type_errors(value: Any, type_name: str, path: str, models: Any) -> list[str]:
    """Where `value` breaks the client's model `type_name`: wrong types and unknown fields
    (the client's own deserializer keeps a dict where an int belongs and drops unknown keys)."""
    if value is None or type_name == "object":
        return []
    if type_name.startswith("list["):
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        return [e for i, item in enumerate(value)
                for e in _type_errors(item, type_name[5:-1], f"{path}[{i}]", models)]
    if type_name.startswith(("dict(", "dict[")):  # the client writes dict[str, str]
        inner = type_name[5:-1].split(", ", 1)[1]
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not a mapping"]
        return [e for key, item in value.items()
                for e in _type_errors(item, inner, f"{path}.{key}", models)]
    if type_name in PRIMITIVES:
        bad = not isinstance(value, PRIMITIVES[type_name]) or (
            type_name in ("int", "float") and isinstance(value, bool))
        return [f"{path}: {value!r} is not {type_name}"] if bad else []
    model = getattr(models, type_name)
    if not isinstance(value, dict):
        return [f"{path}: {value!r} is not a {type_name}"]
    attributes = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = [f"{path}.{key}: not a field of {type_name}" for key in value
              if key not in attributes]
    return errors + [e for key, item in value.items() if key in attributes
                     for e in _type_errors(item, model.openapi_types[attributes[key]],
                                           f"{path}.{key}", models)]


def validate_model(obj: dict[str, Any], type_name: str) -> None:
    """Raise unless `obj` is a valid `type_name` (V1Deployment, V1Service) for the client: its
    required fields (the models' client-side validation) and every field's type."""
    client = import_or_skip("kubernetes.client")
    errors = _type_errors(obj, type_name, obj.get("kind", type_name), client.models)
    if errors:
        raise AssertionError("; ".join(errors))

    class Response:  # what ApiClient.deserialize reads: the body of an API answer
        data = json.dumps(obj)

    client.ApiClient().deserialize(Response(), type_name)  # ValueError on a missing field


# --- the rendered objects -----------------------------------------------------------------

def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_renders_one_pytorchjob_per_group_and_the_lighthouse(tmp_path):
    objects = _render(tmp_path, min_replica_groups=1, quorum_timeout_seconds=90)
    assert [o["kind"] for o in objects] == [
        "ConfigMap", "PyTorchJob", "PyTorchJob", "Deployment", "Service"]
    config_map, *jobs, deployment, service = objects
    assert json.loads(config_map["data"]["resourceconfig.json"])["hosts"] == [
        "algo-1", "algo-2", "algo-3", "algo-4"]  # one contract for the whole job
    lighthouse = "http://llama-ft-lighthouse.training.svc.cluster.local:29510"
    for group, job in enumerate(jobs):
        validate_crd(job)
        name = f"llama-ft-group-{group}"
        assert job["metadata"]["name"] == name
        assert job["metadata"]["labels"]["meshtrain.io/replica-group"] == str(group)
        spec = job["spec"]
        replicas = spec["pytorchReplicaSpecs"]
        assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
        assert {r["restartPolicy"] for r in replicas.values()} == {"OnFailure"}
        assert spec["runPolicy"]["backoffLimit"] == 2  # max_restarts, per group
        assert spec["elasticPolicy"] == {
            "rdzvBackend": "c10d", "rdzvHost": f"{name}-master-0", "rdzvPort": 29400,
            "rdzvId": name, "minReplicas": 2, "maxReplicas": 2, "maxRestarts": 2}
        for replica in replicas.values():
            env = _env(replica["template"]["spec"]["containers"][0])
            assert env[names.MESHTRAIN_FT_REPLICA_GROUP] == str(group)
            assert env[names.MESHTRAIN_FT_REPLICA_GROUPS] == "2"
            assert env[names.MESHTRAIN_FT_LIGHTHOUSE] == lighthouse
            assert env["MESHTRAIN_FT_MIN_REPLICA_GROUPS"] == "1"
            assert env["MESHTRAIN_FT_QUORUM_TIMEOUT_SECONDS"] == "90"
            assert env[names.MESHTRAIN_HOST_OFFSET] == str(2 * group)
            assert env[names.MESHTRAIN_MASTER_ADDR] == f"{name}-master-0"
    # the lighthouse's Service answers at the address the ranks are told
    assert service["metadata"]["name"] == "llama-ft-lighthouse"
    assert service["metadata"]["namespace"] == "training"
    assert service["spec"]["ports"][0]["port"] == int(lighthouse.rsplit(":", 1)[1])
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


def test_lighthouse_deployment_and_service_are_valid_client_objects(tmp_path):
    *_, deployment, service = _render(tmp_path, min_replica_groups=2)
    validate_model(deployment, "V1Deployment")
    validate_model(service, "V1Service")
    assert deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    command = container["command"]
    assert command[0] == "torchft_lighthouse"
    assert command[command.index("--min_replicas") + 1] == "2"  # min_replica_groups
    assert command[command.index("--join_timeout_ms") + 1] == "60000"  # as local jobs run it
    assert command[command.index("--heartbeat_timeout_ms") + 1] == "2000"
    assert command[command.index("--bind") + 1] == "[::]:29510"
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]


@pytest.mark.parametrize(("where", "change", "error", "match"), [
    ("spec", lambda s: s.pop("selector"), ValueError, "selector"),  # a required field
    ("spec", lambda s: s.update(replicas="one"), AssertionError, "'one' is not int"),
    ("spec", lambda s: s.update(replicas={"count": 1}), AssertionError, "is not int"),
    ("spec", lambda s: s.update(replica=1), AssertionError, "replica: not a field"),
    ("container", lambda c: c.pop("name"), ValueError, "name"),
    ("container", lambda c: c["ports"][0].update(containerPort="29510"), AssertionError,
     "containerPort: '29510' is not int"),
])
def test_the_model_check_fails_on_bad_objects(tmp_path, where, change, error, match):
    *_, deployment, _service = _render(tmp_path)
    validate_model(deployment, "V1Deployment")  # the rendered one passes ...
    target = (deployment["spec"] if where == "spec"
              else deployment["spec"]["template"]["spec"]["containers"][0])
    change(target)
    with pytest.raises(error, match=match):  # ... and a broken one does not
        validate_model(deployment, "V1Deployment")


def test_the_service_check_fails_without_a_port_number(tmp_path):
    *_, service = _render(tmp_path)
    del service["spec"]["ports"][0]["port"]
    with pytest.raises(ValueError, match="port"):
        validate_model(service, "V1Service")


def _pod_env(container: dict[str, Any], pod_labels: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet gives it (downward API from the labels)."""
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            label = item["valueFrom"]["fieldRef"]["fieldPath"].split("'")[1]
            env[item["name"]] = pod_labels[label]
    return env


def test_each_pod_is_its_job_wide_host_in_its_groups_world(tmp_path, monkeypatch):
    from meshtrain_runtime.host.contract import HostContract

    config_map, *jobs, _deployment, _service = _render(tmp_path)
    paths = OptMLPaths(tmp_path / "opt-ml")
    paths.input_config_dir.mkdir(parents=True)
    for name in ("resourceconfig.json", "hyperparameters.json", "inputdataconfig.json"):
        (paths.input_config_dir / name).write_text(config_map["data"][name])
    seen = {}
    for group, job in enumerate(jobs):
        for replica_type, replica in job["spec"]["pytorchReplicaSpecs"].items():
            for index in range(replica["replicas"]):
                pod_labels = {"training.kubeflow.org/replica-type": replica_type.lower(),
                              "training.kubeflow.org/replica-index": str(index)}
                env = _pod_env(replica["template"]["spec"]["containers"][0], pod_labels)
                for key, value in env.items():
                    monkeypatch.setenv(key, value)
                contract = HostContract.read(paths)
                seen[contract.current_host] = (group, contract.world_hosts, contract.node_rank,
                                               contract.master_addr)
                assert read_replica_group_env(env).replica_group == group
    assert seen == {
        "algo-1": (0, ["algo-1", "algo-2"], 0, "llama-ft-group-0-master-0"),
        "algo-2": (0, ["algo-1", "algo-2"], 1, "llama-ft-group-0-master-0"),
        "algo-3": (1, ["algo-3", "algo-4"], 0, "llama-ft-group-1-master-0"),
        "algo-4": (1, ["algo-3", "algo-4"], 1, "llama-ft-group-1-master-0"),
    }


def test_without_max_restarts_a_failed_group_is_not_restarted(tmp_path):
    jobs = [o for o in _render(tmp_path, max_restarts=0) if o["kind"] == "PyTorchJob"]
    for job in jobs:
        validate_crd(job)
        assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {
            "Never"}
        assert job["spec"]["runPolicy"]["backoffLimit"] == 0


def test_one_host_groups_have_a_master_only(tmp_path):
    objects = kubernetes.render_all(_estimator(tmp_path, instance_count=2, shard=8),
                                    job_name="ft-two", namespace="default")
    jobs = [o for o in objects if o["kind"] == "PyTorchJob"]
    assert [j["metadata"]["name"] for j in jobs] == ["ft-two-group-0", "ft-two-group-1"]
    for job in jobs:
        validate_crd(job)
        assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
        assert job["spec"]["elasticPolicy"]["maxReplicas"] == 1


def test_k8s_render_prints_every_object(tmp_path, capsys):
    (tmp_path / "train.py").write_text("print('training')\n")
    assert main(["k8s", "render", "train.py", "--source-dir", str(tmp_path),
                 "--instance-type", "ml.p4d.24xlarge", "--instance-count", "4",
                 "--image", IMAGE, "--job-name", "llama-ft",
                 "--distribution", json.dumps(_distribution())]) == 0
    documents = [json.loads(d) for d in capsys.readouterr().out.split("---\n") if d.strip()]
    assert [(d["kind"], d["metadata"]["name"]) for d in documents] == [
        ("ConfigMap", "llama-ft-config"), ("PyTorchJob", "llama-ft-group-0"),
        ("PyTorchJob", "llama-ft-group-1"), ("Deployment", "llama-ft-lighthouse"),
        ("Service", "llama-ft-lighthouse")]


@pytest.mark.parametrize(("arguments", "message"), [
    ({"kind": "TrainJob"}, "not run on Kubernetes as a TrainJob"),
    ({"rendezvous": {"backend": "c10d", "host": "etcd"}}, "each replica group meets at its own"),
    ({"rendezvous": {"min_replicas": 1}}, "exactly its 2 host"),
    ({"job_name": "a" * 49}, "too long for a fault-tolerant Kubernetes job"),
])
def test_refusals_before_anything_is_rendered(tmp_path, arguments, message):
    estimator = _estimator(tmp_path, max_restarts=0 if "kind" in arguments else 2)
    arguments = {"job_name": "llama-ft", **arguments}
    with pytest.raises(ConfigError, match=message):
        kubernetes.render_all(estimator, **arguments)


def test_fit_refuses_it_with_the_reason_before_any_request(tmp_path):
    class NoCluster:  # the client would use this for any request: none may be made
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a request was made ({name})")

    spec = _estimator(tmp_path).build_spec(None, job_name="llama-ft")
    backend = KubernetesBackend(api_client=NoCluster())
    assert len(backend.render(spec)) == 5  # it renders ...
    for call in (backend.validate, backend.submit):  # ... but does not create them
        with pytest.raises(ConfigError, match="render them with `meshtrain k8s render`"):
            call(spec)
    estimator = Estimator("train.py", source_dir=str(tmp_path), instance_count=4,
                          instance_type="k8s:ml.p4d.24xlarge", image_uri=IMAGE,
                          distribution=_distribution(),
                          kubeconfig=str(tmp_path / "absent"))  # no kubeconfig is even read
    with pytest.raises(ConfigError, match="not run on Kubernetes through fit"):
        estimator.fit(job_name="llama-ft", wait=False)


def test_render_alone_refuses_a_job_of_several_objects(tmp_path):
    estimator = _estimator(tmp_path)
    with pytest.raises(ConfigError, match=r"renders 4 objects .*render_all"):
        kubernetes.render(estimator, job_name="llama-ft", namespace="training")
