"""Local Docker backend: every host is a container on this machine, on a per-job network.

The job directory, the per-host /opt/ml trees, the status file and the handle are the local
backend's (`meshtrain.backends.local`); the hosts run the same bootstrap inside containers.
See docs/docker.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import meshtrain
from meshtrain.backends.docker.containers import (
    ALL_GPUS,
    RUNTIME_MOUNT,
    DockerSettings,
    Mount,
    settings_file,
    shm_size_for,
)
from meshtrain.backends.docker.engine import check_engine, docker_binary, remove_job_resources
from meshtrain.backends.docker.volumes import parse_shm_size, parse_volumes
from meshtrain.backends.local.backend import LocalBackend, LocalTrainingJob, _os_error_reason
from meshtrain.backends.local.layout import JobDirectory, local_path, prepare_host
from meshtrain.contract.archive import write_sourcedir_tarball
from meshtrain.contract.env import MESHTRAIN_JOB_NAME, MESHTRAIN_JOB_TOKEN
from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.targets import local_gpu_count

SUPERVISOR_MODULE = "meshtrain.backends.docker.supervisor"


class DockerBackend(LocalBackend):
    """Runs jobs as containers (one per host) under `jobs_dir`, like the local backend.

    Options: ``volumes`` (``{host_path: container_path}`` or ``[(host, container, "ro"|"rw")]``,
    mounted into every container), ``shm_size`` (bytes or "2g"; default 1 GiB per process).
    """

    name = "local_docker"

    def __init__(self, jobs_dir: str | Path | None = None, volumes: Any = None,
                 shm_size: Any = None, **_ignored: Any) -> None:
        super().__init__(jobs_dir)
        self.volumes = parse_volumes(volumes)
        self.shm_size = parse_shm_size(shm_size)

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)
        if spec.instance_type == "local_gpu" and spec.instance_count != 1:
            raise ConfigError(f"instance_type='local_gpu' runs one host with this machine's "
                              f"GPUs, got instance_count={spec.instance_count}. Use 1.")
        if spec.instance_type == "local_gpu" and local_gpu_count() == 0:
            raise ConfigError("instance_type='local_gpu' passes this machine's GPUs to the "
                              "container, but nvidia-smi lists none here. Use "
                              "instance_type='local_docker' (CPU) or run on a GPU machine.")
        docker_binary()

    def submit(self, spec: JobSpec) -> LocalTrainingJob:
        """Check the engine and the image, then lay the job out as the local backend does and
        start its supervisor, which runs the containers. Nothing exists before the checks."""
        self.validate(spec)
        check_engine()
        image = spec.image_uri or _default_image()
        spec, job_dir = self._create_job_directory(spec)
        token = secrets.token_hex(16)
        try:
            job_dir.token_file.write_text(token)
            job_dir.spec_file.write_text(spec.to_json())
            write_sourcedir_tarball(Path(spec.source_dir), job_dir.sourcedir_tarball,
                                    [Path(d) for d in spec.dependencies])
            for host in spec.hosts:
                prepare_host(spec, job_dir, host)
            settings = self.settings_for(spec, job_dir, token, image)
            settings_file(job_dir).write_text(settings.to_json())
            job_dir.write_status(TrainingJobStatus="InProgress", CreationTime=time.time(),
                                 SecondaryStatusTransitions=[])
            job_dir.add_transition("Starting", f"Starting the training job in {image}")
            job_dir.log_file.touch()
            _start_supervisor(job_dir, spec.job_name, token)
        except OSError as error:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise JobFailedError(spec.job_name, _os_error_reason(job_dir.root, error)) from None
        except BaseException:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise
        return DockerTrainingJob(spec.job_name, job_dir)

    def settings_for(self, spec: JobSpec, job_dir: JobDirectory, token: str,
                     image: str) -> DockerSettings:
        """The containers' image, network, shared memory, GPUs and mounts for this job."""
        ppn = spec.distribution_config().torch_distributed.processes_per_host or 1
        return DockerSettings(
            job_name=spec.job_name, token=token, image=image,
            network=f"meshtrain-{spec.job_name}-{token[:8]}",
            shm_size=self.shm_size or shm_size_for(ppn),
            gpus=ALL_GPUS if spec.instance_type == "local_gpu" else 0,
            mounts=[*job_mounts(spec, job_dir), *runtime_mounts(), *self.volumes])

    def attach(self, job_name: str) -> DockerTrainingJob:
        self.load_spec(job_name)
        return DockerTrainingJob(job_name, self.job_directory(job_name))


def job_mounts(spec: JobSpec, job_dir: JobDirectory) -> list[Mount]:
    """The code tarball and every input channel, read-only at the paths the hosts' /opt/ml
    files and links name (so the /opt/ml tree is the local backend's, unchanged)."""
    source = job_dir.sourcedir_tarball.parent
    mounts = [Mount(str(source), str(source))]
    for uri in spec.inputs.values():
        path = str(local_path(uri).resolve())
        mounts.append(Mount(path, path))
    return mounts


def runtime_mounts() -> list[Mount]:
    """This client's own `meshtrain` and `meshtrain_runtime`, read-only on the containers'
    PYTHONPATH: the runtime always matches the client, in any image with python3 and torch."""
    client = Path(meshtrain.__file__).parent
    found = importlib.util.find_spec("meshtrain_runtime")  # located, never imported
    if found is None or found.origin is None:
        raise ConfigError("meshtrain_runtime is not installed beside this client: reinstall "
                          "meshtrain (it ships both packages).")
    runtime = Path(found.origin).parent
    return [Mount(str(client), f"{RUNTIME_MOUNT}/meshtrain"),
            Mount(str(runtime), f"{RUNTIME_MOUNT}/meshtrain_runtime")]


def _default_image() -> str:
    from meshtrain.backends.docker.image import ensure_default_image

    return ensure_default_image()


def _start_supervisor(job_dir: JobDirectory, job_name: str, token: str) -> None:
    """The job's supervisor, detached (the job outlives this client), as the local backend's."""
    import os

    env = {**os.environ, MESHTRAIN_JOB_NAME: job_name, MESHTRAIN_JOB_TOKEN: token}
    with open(job_dir.root / "supervisor.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", SUPERVISOR_MODULE, str(job_dir.root)],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        job_dir.supervisor_pid_file.write_text(str(proc.pid))
    except OSError:
        proc.kill()
        proc.wait()
        raise


class DockerTrainingJob(LocalTrainingJob):
    """Handle of a local Docker job: the local job's, and stop() also removes what a dead
    supervisor left on the engine (the job's containers and network, found by its token)."""

    def describe(self) -> dict[str, Any]:
        description = super().describe()
        with contextlib.suppress(OSError, ValueError):
            image = DockerSettings.from_json(settings_file(self.job_dir).read_text()).image
            description["AlgorithmSpecification"]["TrainingImage"] = image
        return description

    def stop(self) -> None:
        super().stop()
        remove_job_resources(self.token)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """IDs of this job's containers and networks still on the engine (none once ended)."""
        from meshtrain.backends.docker.containers import (
            containers_of_job_command,
            networks_of_job_command,
        )
        from meshtrain.backends.docker.engine import docker

        return (docker(*containers_of_job_command(self.token)).split(),
                docker(*networks_of_job_command(self.token)).split())
