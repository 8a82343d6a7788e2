"""A private Docker engine for the `docker` test tier (docs/testing.md, "Docker tier").

dockerd is started by hand with its own socket, data root and exec root under a temporary
directory (overlay2, no iptables, no default bridge: user-defined networks still work), and is
stopped by its pid after the job networks are removed. Nothing is installed here: a missing
dockerd or a non-root user is a reason to skip (to fail under CI=true, conftest.py); a daemon
that does not answer raises with its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

READY_SECONDS = 30.0
STOP_SECONDS = 30.0
RUN_DOCKER = Path("/run/docker")


@dataclass
class Daemon:
    """A running private dockerd."""

    root: Path
    pid: int
    created_run_docker: bool

    @property
    def host(self) -> str:
        return f"unix://{self.root / 'docker.sock'}"

    def docker(self, *arguments: str, check: bool = True) -> str:
        env = {**os.environ, "DOCKER_HOST": self.host, "DOCKER_BUILDKIT": "0"}
        result = subprocess.run(["docker", *arguments], capture_output=True, text=True,
                                env=env, timeout=300, check=False)
        if check and result.returncode:
            raise RuntimeError(f"docker {' '.join(arguments)}: {result.stderr.strip()}")
        return result.stdout


def why_not_startable() -> str | None:
    """Why no engine can start here (None: try it)."""
    if not shutil.which("dockerd"):
        return "no dockerd on PATH (install the docker.io package; .ci/run does)"
    if not shutil.which("docker"):
        return "no docker CLI on PATH"
    if os.geteuid() != 0:
        return "dockerd needs root and the tests do not run as root"
    return None


def start_daemon(root: Path) -> Daemon:
    """Start dockerd under `root`; RuntimeError with its log if it does not answer in time."""
    root.mkdir(parents=True, exist_ok=True)
    created = not RUN_DOCKER.exists()
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115  (kept open by the daemon)
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{root / 'docker.sock'}",
         "--iptables=false", "--ip6tables=false", "--bridge=none",
         "--storage-driver=overlay2", "--default-ulimit", "nofile=1024:1024"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    daemon = Daemon(root, proc.pid, created)
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            daemon.docker("version", "--format", "{{.Server.Version}}")
            return daemon
        time.sleep(0.3)
    # read before stop_daemon, which removes the daemon's root with its log
    tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
    stop_daemon(daemon)
    raise RuntimeError(f"dockerd did not start (exit {proc.poll()}):\n{tail}")


def stop_daemon(daemon: Daemon) -> None:
    """Remove every container and user network, SIGTERM the daemon by pid, wait, clean up."""
    with contextlib.suppress(Exception):
        ids = daemon.docker("ps", "-aq").split()
        if ids:
            daemon.docker("rm", "-f", *ids, check=False)
        for name in daemon.docker("network", "ls", "--format", "{{.Name}}").split():
            if name not in ("bridge", "host", "none"):
                daemon.docker("network", "rm", name, check=False)
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while time.monotonic() < deadline and _alive(daemon.pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(daemon.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(daemon.pid, 0)
    _unmount_under(daemon.root)
    shutil.rmtree(daemon.root, ignore_errors=True)
    if daemon.created_run_docker and not _other_dockerd_running():
        shutil.rmtree(RUN_DOCKER, ignore_errors=True)


def _other_dockerd_running() -> bool:
    """Another engine on this machine (another test run, the system's) may use /run/docker."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split()
        except OSError:
            continue
        if fields[1] == "(dockerd)" and fields[2] != "Z":
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _unmount_under(root: Path) -> None:
    """Mounts a killed daemon may leave (overlay, shm) under its roots, deepest first."""
    prefix = str(root.resolve())
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
