"""Local Docker backend: every host is a container on this machine, on a per-job network.

The job directory, the per-host /opt/ml trees, the status file and the handle are the shared
host layer's (`meshtrain.backends.hosts`), as for local jobs; the hosts run the same bootstrap
inside containers.
See docs/docker.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtrain.backends.docker.containers import (
    ALL_GPUS,
    RUNTIME_MOUNT,
    DockerSettings,
    Mount,
    owner_user,
    settings_file,
    shm_size_for,
)
from meshtrain.backends.docker.engine import check_engine, docker_binary, remove_job_resources
from meshtrain.backends.docker.volumes import parse_shm_size, parse_volumes
from meshtrain.backends.hosts.backend import HostBackend, readable
from meshtrain.backends.hosts.job import HostTrainingJob
from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder, local_path
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.version import CLIENT_PACKAGE

if TYPE_CHECKING:
    from meshtrain.targets import Target


GPU_TARGET = "local_gpu"
"""The target kind whose one container gets this machine's GPUs."""


class DockerTrainingJob(HostTrainingJob):
    """Handle of a local Docker job: the host layer's, and stop() also removes what a dead
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


class DockerBackend(HostBackend):
    """Runs jobs as containers (one per host) under `jobs_dir`, beside local jobs.

    Options: ``volumes`` (``{host_path: container_path}`` or ``[(host, container, "ro"|"rw")]``,
    mounted into every container), ``shm_size`` (bytes or "2g"; default 1 GiB per process).
    """

    name = "local_docker"
    title = "local Docker"
    supervisor_module = "meshtrain.backends.docker.supervisor"
    job_class = DockerTrainingJob

    def __init__(self, target: Target | None = None, jobs_dir: str | Path | None = None,
                 volumes: Any = None, shm_size: Any = None, **_ignored: Any) -> None:
        super().__init__(target, jobs_dir)
        self.volumes = parse_volumes(volumes)
        self.shm_size = parse_shm_size(shm_size)

    @property
    def passes_gpus(self) -> bool:
        """Whether the containers get this machine's GPUs (the local_gpu target)."""
        return self.target is not None and self.target.name == GPU_TARGET

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)
        if self.passes_gpus and spec.instance_count != 1:
            raise ConfigError(f"instance_type='local_gpu' runs one host with this machine's "
                              f"GPUs, got instance_count={spec.instance_count}. Use 1.")
        if self.passes_gpus and self.target is not None and self.target.gpus_per_host == 0:
            raise ConfigError("instance_type='local_gpu' passes this machine's GPUs to the "
                              "container, but nvidia-smi lists none here. Use "
                              "instance_type='local_docker' (CPU) or run on a GPU machine.")
        docker_binary()

    def owns(self, job_name: str) -> bool:
        """A Docker job's directory says so (one made before it did has Docker settings)."""
        job_dir = self.job_directory(job_name)
        with readable(self.jobs_dir):
            if not job_dir.spec_file.exists():
                return False
            recorded = job_dir.backend_file.exists()
            return (job_dir.read_backend() == self.name if recorded
                    else settings_file(job_dir).exists())

    def resolve_spec(self, spec: JobSpec) -> JobSpec:
        """The engine must answer and the image exist (built on first use) before anything is
        made; the spec records the image the hosts run."""
        check_engine()
        return spec.model_copy(update={"image_uri": spec.image_uri or _default_image()})

    def prepare_job(self, spec: JobSpec, job_dir: JobDirectory, token: str) -> None:
        settings_file(job_dir).write_text(
            self.settings_for(spec, job_dir, token, spec.image_uri or "").to_json())

    def starting_message(self, spec: JobSpec) -> str:
        return f"Starting the training job in {spec.image_uri}"

    def settings_for(self, spec: JobSpec, job_dir: JobDirectory, token: str,
                     image: str) -> DockerSettings:
        """The containers' image, network, shared memory, GPUs and mounts for this job."""
        ppn = spec.distribution_config().torch_distributed.processes_per_host or 1
        return DockerSettings(
            job_name=spec.job_name, token=token, image=image,
            network=f"meshtrain-{spec.job_name}-{token[:8]}",
            shm_size=self.shm_size or shm_size_for(ppn),
            gpus=ALL_GPUS if self.passes_gpus else 0,
            mounts=[*job_mounts(spec, job_dir), *runtime_mounts(), *self.volumes],
            user=owner_user())

def job_mounts(spec: JobSpec, job_dir: JobDirectory) -> list[Mount]:
    """The code tarball and every input channel, read-only at the paths the hosts' /opt/ml
    files and links name (so the /opt/ml tree is the local backend's, unchanged), and the job's
    one checkpoint folder, read-write (SM_CHECKPOINT_DIR names the same path inside)."""
    source = job_dir.sourcedir_tarball.parent
    checkpoints = str(checkpoint_folder(spec, job_dir))
    mounts = [Mount(str(source), str(source)), Mount(checkpoints, checkpoints, read_only=False)]
    for uri in spec.inputs.values():
        path = str(local_path(uri).resolve())
        mounts.append(Mount(path, path))
    return mounts


def runtime_mounts() -> list[Mount]:
    """This client's own `meshtrain` and `meshtrain_runtime`, read-only on the containers'
    PYTHONPATH: the runtime always matches the client, in any image with python3 and torch."""
    client = CLIENT_PACKAGE
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
