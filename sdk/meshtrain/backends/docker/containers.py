"""The `docker` command lines of a job: its network, one `docker run` per host, the cleanup.

Pure functions of a :class:`DockerSettings` (what the backend resolved at submit and wrote to
``docker.json`` in the job directory), so the arguments are unit-tested without an engine.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meshtrain.contract import env as names
from meshtrain.contract.env import BOOTSTRAP_MODULE
from meshtrain.contract.paths import DEFAULT_BASE_DIR

LABEL_JOB = "meshtrain.job"
LABEL_TOKEN = "meshtrain.token"
CONTAINER_OPT_ML = DEFAULT_BASE_DIR
RUNTIME_MOUNT = "/opt/meshtrain/python"
"""Where the client's own `meshtrain` and `meshtrain_runtime` packages are mounted (read-only)."""
MASTER_PORT = 7777
SHM_BYTES_PER_PROCESS = 1 << 30
MIN_SHM_BYTES = 1 << 30
ALL_GPUS = -1


@dataclass(frozen=True)
class Mount:
    """A bind mount: `source` on this machine at `target` in every container."""

    source: str
    target: str
    read_only: bool = True

    def argument(self) -> str:
        """The `--mount` value (comma-separated, so paths with ':' work)."""
        text = f"type=bind,source={self.source},target={self.target}"
        return text + (",readonly" if self.read_only else "")


@dataclass(frozen=True)
class DockerSettings:
    """Everything the job's supervisor needs to start and end its containers."""

    job_name: str
    token: str
    image: str
    network: str
    shm_size: int
    gpus: int = 0
    """0: none; ALL_GPUS: every GPU of the machine; n: the first n (device requests)."""
    mounts: list[Mount] = field(default_factory=list)
    """Job-wide mounts: the code tarball, input channels, the runtime, the user's volumes."""
    user: str = ""
    """``uid:gid`` the containers run as: the job's owner, who alone can read the job's files
    (contract/private_files.py); "" for a job made before (the image's own user)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> DockerSettings:
        values = json.loads(text)
        values["mounts"] = [Mount(**m) for m in values["mounts"]]
        return cls(**values)


SETTINGS_FILE = "docker.json"


def settings_file(job_dir: Any) -> Path:
    """Where a job directory keeps its DockerSettings (read by its supervisor and stop())."""
    return Path(job_dir.root) / SETTINGS_FILE


def container_name(job_name: str, host: str) -> str:
    """Unique on the engine (two jobs may both have an algo-1); the hostname is `host` itself."""
    return f"{job_name}-{host}"


def shm_size_for(processes_per_host: int) -> int:
    """`--shm-size` in bytes: 1 GiB per process on the host (data loader workers pass batches
    through /dev/shm; docker's default of 64 MiB makes them crash with a bus error)."""
    return max(MIN_SHM_BYTES, processes_per_host * SHM_BYTES_PER_PROCESS)


def network_create_command(settings: DockerSettings) -> list[str]:
    return ["network", "create", "--driver", "bridge",
            "--label", f"{LABEL_JOB}={settings.job_name}",
            "--label", f"{LABEL_TOKEN}={settings.token}", settings.network]


def gpu_arguments(gpus: int) -> list[str]:
    """`--gpus` (the CLI's form of a DeviceRequest with capabilities [["gpu"]])."""
    if gpus == 0:
        return []
    return ["--gpus", "all" if gpus == ALL_GPUS else str(gpus)]


def container_environment(settings: DockerSettings, host: str, host_env: dict[str, str],
                          work_dir: str) -> dict[str, str]:
    """The host's environment inside its container: the user's, then the contract's. No job
    token: the bootstrap is the container's main process and has no supervisor parent to die
    with (meshtrain_runtime.host.lifeline); removing the container ends the host."""
    env = {k: v for k, v in host_env.items() if k != names.MESHTRAIN_JOB_TOKEN}
    env.update({
        names.SAGEMAKER_BASE_DIR: CONTAINER_OPT_ML,
        names.MESHTRAIN_MASTER_ADDR: "algo-1",
        names.MESHTRAIN_MASTER_PORT: str(MASTER_PORT),
        names.MESHTRAIN_JOB_NAME: settings.job_name,
        names.MESHTRAIN_HOST_WORK_DIR: work_dir,
        names.TRAINING_JOB_NAME: settings.job_name,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": RUNTIME_MOUNT,
    })
    return env


def run_command(settings: DockerSettings, host: str, opt_ml: Path, work_dir: Path,
                host_env: dict[str, str], by_name: frozenset[str] = frozenset()) -> list[str]:
    """`docker run` for one host, attached (its output is the host's log, its exit code the
    host's), named `<job>-<host>` with hostname `host` on the job's network, as the job's owner.
    The variables named in `by_name` (the user's environment, which may hold secrets) are
    passed as ``--env NAME``: docker reads their values from its own environment, so they never
    appear on a command line that every user of the machine can read (ps)."""
    argv = ["run", "--name", container_name(settings.job_name, host), "--hostname", host,
            "--network", settings.network, "--network-alias", host,
            "--label", f"{LABEL_JOB}={settings.job_name}",
            "--label", f"{LABEL_TOKEN}={settings.token}",
            "--shm-size", str(settings.shm_size),
            "--mount", Mount(str(opt_ml), CONTAINER_OPT_ML, read_only=False).argument(),
            "--mount", Mount(str(work_dir), str(work_dir), read_only=False).argument()]
    for mount in settings.mounts:
        argv += ["--mount", mount.argument()]
    argv += gpu_arguments(settings.gpus) + user_arguments(settings.user)
    for key, value in sorted(container_environment(settings, host, host_env,
                                                   str(work_dir)).items()):
        argv += ["--env", key if key in by_name else f"{key}={value}"]
    return [*argv, settings.image, "python3", "-m", BOOTSTRAP_MODULE]


def user_arguments(user: str) -> list[str]:
    """`--user uid:gid` (the job's owner); a user other than root, whom the image may not know,
    also gets a writable HOME and a USER name (pip and torch's caches look them up)."""
    if not user:
        return []
    argv = ["--user", user]
    if not user.startswith("0:"):
        argv += ["--env", "HOME=/tmp", "--env", f"USER=uid{user.split(':')[0]}"]
    return argv


def owner_user() -> str:
    """This process's `uid:gid`: who a job's containers run as."""
    return f"{os.getuid()}:{os.getgid()}"


def containers_of_job_command(token: str) -> list[str]:
    """IDs of every container (running or not) carrying the job's token label."""
    return ["ps", "--all", "--quiet", "--filter", f"label={LABEL_TOKEN}={token}"]


def networks_of_job_command(token: str) -> list[str]:
    return ["network", "ls", "--quiet", "--filter", f"label={LABEL_TOKEN}={token}"]
