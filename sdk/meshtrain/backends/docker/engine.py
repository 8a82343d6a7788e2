"""The Docker Engine through its CLI: `docker` on PATH, talking to $DOCKER_HOST (or the default
socket). meshtrain needs no Python package for it and never uses compose."""

from __future__ import annotations

import shutil
import subprocess

from meshtrain.contract.errors import ConfigError

QUICK_TIMEOUT = 60


def docker_binary() -> str:
    """The docker CLI; ConfigError if it is not installed."""
    path = shutil.which("docker")
    if path is None:
        raise ConfigError("instance_type='local_docker'/'local_gpu' runs the job in Docker "
                          "containers, but no `docker` command is on PATH. Install Docker "
                          "(e.g. the docker.io package) or use instance_type='local'.")
    return path


def docker(*arguments: str, timeout: float = QUICK_TIMEOUT, check: bool = True,
           input_bytes: bytes | None = None) -> str:
    """Run `docker <arguments>` and return its stdout; RuntimeError with its stderr if it fails."""
    result = subprocess.run([docker_binary(), *arguments], capture_output=True, timeout=timeout,
                            input=input_bytes, check=False)
    if check and result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"docker {' '.join(arguments[:3])} failed: {message}")
    return result.stdout.decode(errors="replace")


def check_engine() -> None:
    """ConfigError naming the engine's own message when the daemon cannot be reached."""
    try:
        docker("version", "--format", "{{.Server.Version}}", timeout=20)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"the Docker engine is not reachable ({error}). Start dockerd (or "
                          "point DOCKER_HOST at its socket), or use instance_type='local'."
                          ) from None


def image_exists(image: str) -> bool:
    return bool(docker("images", "--quiet", image).strip())


def stop_job_containers(token: str, grace_seconds: float) -> None:
    """`docker stop` the job's running containers: SIGTERM to each host's bootstrap (which passes
    it to torchrun and the ranks), SIGKILL after `grace_seconds`."""
    from meshtrain.backends.docker.containers import containers_of_job_command

    running = docker(*containers_of_job_command(token), "--filter", "status=running").split()
    if running:
        docker("stop", "--time", str(int(grace_seconds)), *running,
               timeout=grace_seconds + QUICK_TIMEOUT, check=False)


def remove_job_resources(token: str) -> tuple[int, int]:
    """Force-remove every container, then every network, labelled with the job's token.
    Returns (containers, networks) removed. Safe to call any number of times."""
    from meshtrain.backends.docker.containers import (
        containers_of_job_command,
        networks_of_job_command,
    )

    containers = docker(*containers_of_job_command(token)).split()
    if containers:
        docker("rm", "--force", "--volumes", *containers, timeout=120, check=False)
    networks = docker(*networks_of_job_command(token)).split()
    for network in networks:
        docker("network", "rm", network, check=False)
    return len(containers), len(networks)
