"""The Docker backend's container arguments and option checks, without an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.backends.docker.containers import (
    ALL_GPUS,
    CONTAINER_OPT_ML,
    RUNTIME_MOUNT,
    DockerSettings,
    gpu_arguments,
    run_command,
    shm_size_for,
)
from meshtrain.backends.docker.supervisor import host_environment
from meshtrain.backends.docker.volumes import parse_shm_size, parse_volumes
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.contract.env import BOOTSTRAP_MODULE, MESHTRAIN_JOB_TOKEN

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"
TWO_PROCESSES = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}


def settings(tmp_path: Path, instance_type: str, count: int = 1, **options) -> DockerSettings:
    estimator = Estimator("train.py", source_dir=str(QUICKSTART), instance_type=instance_type,
                          instance_count=count, distribution=TWO_PROCESSES,
                          environment={"MY_VAR": "1"}, jobs_dir=str(tmp_path), **options)
    spec = estimator.build_spec(None, "job-x")
    return estimator.backend.settings_for(  # the backend gets the Target (GPUs or not)
        spec, JobDirectory(tmp_path / "job-x"), "t0k3n" * 4, "some/image:1")


def arguments(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, value in enumerate(argv) if value == flag]


def test_local_gpu_passes_every_gpu_as_a_device_request(tmp_path):
    gpu = settings(tmp_path, "local_gpu")
    assert gpu.gpus == ALL_GPUS
    argv = run_command(gpu, "algo-1", tmp_path / "opt", tmp_path / "work", {})
    assert arguments(argv, "--gpus") == ["all"]
    cpu = settings(tmp_path, "local_docker", count=2)
    assert "--gpus" not in run_command(cpu, "algo-1", tmp_path / "opt", tmp_path / "work", {})
    assert gpu_arguments(2) == ["--gpus", "2"] and gpu_arguments(0) == []


def test_local_gpu_without_gpus_is_a_config_error_before_anything_exists(tmp_path,
                                                                           monkeypatch):
    from meshtrain import targets

    monkeypatch.setattr(targets, "local_gpu_count", lambda: 0)
    estimator = Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local_gpu",
                          jobs_dir=str(tmp_path / "jobs"), image_uri="img:1")
    with pytest.raises(ConfigError, match="nvidia-smi lists none"):
        estimator.fit(wait=False)
    assert not (tmp_path / "jobs").exists()


def test_local_gpu_is_one_host(tmp_path):
    with pytest.raises(ConfigError, match="instance_count"):
        Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local_gpu",
                  instance_count=2, jobs_dir=str(tmp_path)).fit(wait=False)
    assert not any(tmp_path.iterdir())


def test_each_host_is_a_named_container_on_the_jobs_network(tmp_path):
    job = settings(tmp_path, "local_docker", count=2)
    opt_ml, work = tmp_path / "hosts/algo-2/opt/ml", tmp_path / "hosts/algo-2/work"
    argv = run_command(job, "algo-2", opt_ml, work, {"MY_VAR": "1", MESHTRAIN_JOB_TOKEN: "x"})
    assert argv[:3] == ["run", "--name", "job-x-algo-2"]
    assert arguments(argv, "--hostname") == ["algo-2"]
    assert arguments(argv, "--network") == [job.network]
    assert arguments(argv, "--shm-size") == [str(2 << 30)]  # 1 GiB per process
    mounts = arguments(argv, "--mount")
    assert f"type=bind,source={opt_ml},target={CONTAINER_OPT_ML}" in mounts
    assert any(m.endswith(f"target={RUNTIME_MOUNT}/meshtrain_runtime,readonly") for m in mounts)
    assert any(m.endswith(f"target={RUNTIME_MOUNT}/meshtrain,readonly") for m in mounts)
    env = dict(value.split("=", 1) for value in arguments(argv, "--env"))
    assert env["MY_VAR"] == "1" and env["PYTHONPATH"] == RUNTIME_MOUNT
    assert env["MESHTRAIN_MASTER_ADDR"] == "algo-1" and env["SAGEMAKER_BASE_DIR"] == "/opt/ml"
    assert MESHTRAIN_JOB_TOKEN not in env  # the bootstrap must not wait for a supervisor parent
    assert argv[-4:] == ["some/image:1", "python3", "-m", BOOTSTRAP_MODULE]


def test_hosts_share_the_jobs_checkpoint_folder_and_know_their_attempt(tmp_path):
    """As with local processes: one checkpoint folder for every host (mounted read-write at the
    same path, named by SM_CHECKPOINT_DIR), and MESHTRAIN_ATTEMPT for a restarted job."""
    job = settings(tmp_path, "local_docker", count=2)
    folder = str(tmp_path / "job-x" / "checkpoints")
    assert any(m.source == folder and m.target == folder and not m.read_only for m in job.mounts)
    estimator = Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local_docker",
                          instance_count=2, distribution=TWO_PROCESSES, jobs_dir=str(tmp_path),
                          environment={"MY_VAR": "1"})
    spec = estimator.build_spec(None, "job-x")
    env = host_environment(spec, JobDirectory(tmp_path / "job-x"), attempt=2)
    argv = run_command(job, "algo-2", tmp_path / "opt", tmp_path / "work", env)
    passed = dict(value.split("=", 1) for value in arguments(argv, "--env"))
    assert passed["SM_CHECKPOINT_DIR"] == folder and passed["MESHTRAIN_ATTEMPT"] == "2"
    assert passed["MY_VAR"] == "1"


def test_settings_survive_the_job_directory(tmp_path):
    job = settings(tmp_path, "local_docker", volumes={str(tmp_path): "/data"}, shm_size="3g")
    assert DockerSettings.from_json(job.to_json()) == job
    assert job.shm_size == 3 << 30
    assert job.mounts[-1].target == "/data" and job.mounts[-1].read_only


@pytest.mark.parametrize(("value", "size"), [("512m", 512 << 20), (1 << 30, 1 << 30),
                                             ("2G", 2 << 30), (None, None)])
def test_shm_sizes(value, size):
    assert parse_shm_size(value) == size
    assert shm_size_for(1) == 1 << 30


@pytest.mark.parametrize("value", ["10k", "lots", True, "1.5g"])
def test_bad_shm_sizes_are_config_errors(value):
    with pytest.raises(ConfigError, match="shm_size"):
        parse_shm_size(value)


@pytest.mark.parametrize(("volumes", "match"), [
    ("/data", "must be a dict"),
    ([("relative", "/x", "ro")], "absolute path that exists"),
    ([("/", "/opt/ml", "ro")], "not / or /opt/ml"),
    ([("/", "/x", "readonly")], "'ro' or 'rw'"),
])
def test_bad_volumes_are_config_errors_at_the_estimator(tmp_path, volumes, match):
    with pytest.raises(ConfigError, match=match):
        Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local_docker",
                  volumes=volumes, jobs_dir=str(tmp_path))
    assert parse_volumes({"/": "/host"})[0].read_only


def test_docker_options_are_refused_by_other_targets(tmp_path):
    with pytest.raises(ConfigError, match="shm_size are local Docker options"):
        Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local", shm_size="1g")


def test_no_docker_command_or_engine_is_a_config_error_before_anything_exists(
        tmp_path, monkeypatch):
    estimator = Estimator("train.py", source_dir=str(QUICKSTART), instance_type="local_docker",
                          jobs_dir=str(tmp_path / "jobs"), image_uri="img:1")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="no `docker` command is on PATH"):
        estimator.fit(wait=False)
    monkeypatch.undo()
    if not __import__("shutil").which("docker"):
        pytest.skip("no docker CLI here to check an unreachable engine with")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(ConfigError, match="Docker engine is not reachable"):
        estimator.fit(wait=False)
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())
