"""The process that runs one local Docker job: the local supervisor, with containers for hosts.

Started detached by the Docker backend (``python -m meshtrain.backends.docker.supervisor DIR``).
Everything the local supervisor does (merged `[algo-N]` log, stopping the others when one host
fails, max_run, root-cause failure from the hosts' records, model.tar.gz / output.tar.gz) is
inherited; only how a host starts and ends differs: each host is an attached `docker run` on the
job's network, and the job's end (success, failure, stop) removes its containers and network.
"""

from __future__ import annotations

import subprocess
import threading
from collections import deque

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
from meshtrain.backends.local.layout import JobDirectory, checkpoint_folder
from meshtrain.backends.local.processes import terminate_groups
from meshtrain.backends.local.supervisor import (
    STOP_GRACE_SECONDS,
    TAIL_LINES,
    Supervisor,
    supervise,
)
from meshtrain.contract import env as names
from meshtrain.contract.jobspec import JobSpec

CLI_GRACE_SECONDS = 10.0


def host_environment(spec: JobSpec, job_dir: JobDirectory, attempt: int) -> dict[str, str]:
    """What every container gets beside the contract's names (containers.container_environment):
    the user's environment, the job's one checkpoint folder (mounted at the same path) and the
    attempt number of a restarted job."""
    return {**spec.environment,
            names.SM_CHECKPOINT_DIR: str(checkpoint_folder(spec, job_dir)),
            names.MESHTRAIN_ATTEMPT: str(attempt)}


class DockerSupervisor(Supervisor):
    """Runs the hosts of one job as containers and removes them when the job ends."""

    label = "docker supervisor"

    @staticmethod
    def release_job(token: str) -> None:
        """The job's containers and network go with it, also after a crash of the supervisor."""
        remove_job_resources(token)

    def __init__(self, job_dir: JobDirectory) -> None:
        super().__init__(job_dir)
        self.settings = DockerSettings.from_json(settings_file(job_dir).read_text())

    def start_hosts(self, attempt: int = 1) -> list[threading.Thread]:
        """Every host as a fresh container on a fresh job network (each attempt: the previous
        attempt's containers and network were removed by end_hosts)."""
        docker(*network_create_command(self.settings))
        readers = []
        self.hosts, self.tails, self.failed_hosts = {}, {}, []
        checkpoint_folder(self.spec, self.job_dir).mkdir(parents=True, exist_ok=True)
        host_env = host_environment(self.spec, self.job_dir, attempt)
        for host in self.spec.hosts:
            work_dir = self.job_dir.host_work_dir(host)
            work_dir.mkdir(parents=True, exist_ok=True)
            argv = run_command(self.settings, host, self.job_dir.host_paths(host).base,
                               work_dir, host_env)
            proc = subprocess.Popen([docker_binary(), *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            self.hosts[host] = proc
            self.tails[host] = deque(maxlen=TAIL_LINES)
            reader = threading.Thread(target=self._pump, args=(host, proc), daemon=True)
            reader.start()
            readers.append(reader)
        return readers

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
