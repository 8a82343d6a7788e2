"""The supervisor of one local job: every host is a bootstrap process tree on this machine.

Started detached by the local backend (``python -m meshtrain.backends.local.supervisor DIR``);
watching, restarts, stopping, packing and the recorded outcome are the shared host supervisor's
(meshtrain.backends.hosts.supervisor). See docs/local-jobs.md.
"""

from __future__ import annotations

import os
import socket
import sys

from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder, source_root
from meshtrain.backends.hosts.supervisor import HostSupervisor, supervise
from meshtrain.contract import env as names
from meshtrain.contract.job_environment import MESHTRAIN_JOB_ENVIRONMENT
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.network import LOOPBACK, LOOPBACK_INTERFACE
from meshtrain.targets import local_gpu_count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def host_environment(spec: JobSpec, job_dir: JobDirectory, host: str, port: int,
                     token: str, attempt: int = 1) -> dict:
    env = dict(os.environ)
    env.pop(MESHTRAIN_JOB_ENVIRONMENT, None)  # the values themselves follow
    env.update(spec.environment)
    env.update({  # after the user's environment: these must not be overridden
        names.SAGEMAKER_BASE_DIR: str(job_dir.host_paths(host).base),
        names.MESHTRAIN_MASTER_ADDR: LOOPBACK,
        # the hosts meet on loopback: gloo's and NCCL's sockets listen there, not on the
        # interface the machine's name resolves to (contract/network.py)
        "GLOO_SOCKET_IFNAME": LOOPBACK_INTERFACE,
        "NCCL_SOCKET_IFNAME": LOOPBACK_INTERFACE,
        names.MESHTRAIN_MASTER_PORT: str(port),
        names.MESHTRAIN_JOB_NAME: spec.job_name,
        names.MESHTRAIN_JOB_TOKEN: token,
        names.MESHTRAIN_HOST_WORK_DIR: str(job_dir.host_work_dir(host)),
        names.TRAINING_JOB_NAME: spec.job_name,
        names.SM_CHECKPOINT_DIR: str(checkpoint_folder(spec, job_dir)),
        names.MESHTRAIN_ATTEMPT: str(attempt),
        names.MESHTRAIN_SOURCE_DIR: source_root(spec),
        "PYTHONUNBUFFERED": "1",
    })
    env.setdefault(names.MESHTRAIN_NUM_GPUS, str(local_gpu_count()))  # as the client counted
    return env


class LocalSupervisor(HostSupervisor):
    """Every host is `python -m <bootstrap>` in a session of its own."""

    label = "local supervisor"
    port = 0

    def __init__(self, job_dir: JobDirectory) -> None:
        super().__init__(job_dir)
        self.group_ports: dict[int, int] = {}  # a fault-tolerant job: one rendezvous per group

    def prepare_attempt(self, attempt: int) -> None:
        self.port = free_port()  # each attempt gets a fresh rendezvous

    def prepare_group(self, group: int, attempt: int) -> None:
        self.group_ports[group] = free_port()  # a restarted group meets afresh, alone

    def host_process(self, host: str, attempt: int) -> tuple[list[str], dict[str, str] | None]:
        extra = self.host_extra_env.get(host, {})
        group = extra.get(names.MESHTRAIN_FT_REPLICA_GROUP)
        port = self.group_ports[int(group)] if group is not None else self.port
        env = host_environment(self.spec, self.job_dir, host, port, self.token, attempt)
        env.update(extra)
        return [sys.executable, "-m", names.BOOTSTRAP_MODULE], env


def main() -> None:
    supervise(LocalSupervisor)


if __name__ == "__main__":
    main()
