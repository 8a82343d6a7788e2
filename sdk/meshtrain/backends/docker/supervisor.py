"""The process that runs one local Docker job: the shared host supervisor, with containers.

Started detached by the Docker backend (``python -m meshtrain.backends.docker.supervisor DIR``).
Everything the host supervisor does (merged `[algo-N]` log, stopping the others when one host
fails, max_run, root-cause failure from the hosts' records, model.tar.gz / output.tar.gz) is
shared with local jobs (meshtrain.backends.hosts.supervisor); only how a host starts and ends
differs: each host is an attached `docker run` on the
job's network, and the job's end (success, failure, stop) removes its containers and network.
"""

from __future__ import annotations

import os

from meshtrain.backends.docker.containers import (
    DockerSettings,
    network_create_command,
    run_command,
    settings_file,
)
from meshtrain.backends.docker.engine import (
    docker,
    docker_binary,
    remove_job_resources,
    stop_job_containers,
)
from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder, source_root
from meshtrain.backends.hosts.processes import terminate_groups
from meshtrain.backends.hosts.supervisor import STOP_GRACE_SECONDS, HostSupervisor, supervise
from meshtrain.contract import env as names
from meshtrain.contract.job_environment import MESHTRAIN_JOB_ENVIRONMENT
from meshtrain.contract.jobspec import JobSpec

CLI_GRACE_SECONDS = 10.0


def host_environment(spec: JobSpec, job_dir: JobDirectory, attempt: int) -> dict[str, str]:
    """What every container gets beside the contract's names (containers.container_environment):
    the user's environment, the job's one checkpoint folder (mounted at the same path), the
    attempt number of a restarted job and the source folder its tracebacks name."""
    return {**spec.environment,
            names.SM_CHECKPOINT_DIR: str(checkpoint_folder(spec, job_dir)),
            names.MESHTRAIN_ATTEMPT: str(attempt),
            names.MESHTRAIN_SOURCE_DIR: source_root(spec)}


class DockerSupervisor(HostSupervisor):
    """Runs the hosts of one job as containers and removes them when the job ends."""

    label = "docker supervisor"

    @staticmethod
    def release_job(token: str) -> None:
        """The job's containers and network go with it, also after a crash of the supervisor."""
        remove_job_resources(token)

    def __init__(self, job_dir: JobDirectory) -> None:
        super().__init__(job_dir)
        self.settings = DockerSettings.from_json(settings_file(job_dir).read_text())
        self.host_env: dict[str, str] = {}

    def prepare_attempt(self, attempt: int) -> None:
        """A fresh job network for each attempt (the previous attempt's containers and network
        were removed by end_hosts)."""
        docker(*network_create_command(self.settings))
        self.host_env = host_environment(self.spec, self.job_dir, attempt)

    def host_process(self, host: str, attempt: int) -> tuple[list[str], dict[str, str] | None]:
        """An attached `docker run` of the host's container; the user's environment values go
        in the docker client's environment, named on its command line (DOCKER_* ones, which
        would steer the client itself, by value)."""
        by_name = frozenset(k for k in self.spec.environment if not k.startswith("DOCKER_"))
        argv = run_command(self.settings, host, self.job_dir.host_paths(host).base,
                           self.job_dir.host_work_dir(host), self.host_env, by_name)
        client_env = {**os.environ, **{k: self.spec.environment[k] for k in by_name}}
        client_env.pop(MESHTRAIN_JOB_ENVIRONMENT, None)
        return [docker_binary(), *argv], client_env

    def end_hosts(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """A stop first gives the ranks their grace period (`docker stop`); then the job's
        containers (which ends their `docker run`s) and its network are removed."""
        if grace_seconds > STOP_GRACE_SECONDS:
            stop_job_containers(self.settings.token, grace_seconds)
        remove_job_resources(self.settings.token)
        clients = [proc.pid for proc in self.hosts.values() if proc.poll() is None]
        if clients:
            terminate_groups(clients, CLI_GRACE_SECONDS)
        for proc in self.hosts.values():
            proc.wait()


def main() -> None:
    supervise(DockerSupervisor)


if __name__ == "__main__":
    main()
