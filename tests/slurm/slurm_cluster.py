"""A real two-node Slurm cluster on this machine, for tests: munged with its own key and socket,
slurmctld and slurmd n1 and n2 with their own slurm.conf (SLURM_CONF), free loopback ports.

Every daemon runs in the foreground, started here and stopped by pid; nothing of /etc is touched
(/work/shared/reference/test-infrastructure.md, "Slurm").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scontrol")
NODES = ("n1", "n2")
START_SECONDS = 60


class ClusterError(RuntimeError):
    """The cluster did not start; the message carries the daemons' logs."""


def missing_binaries() -> list[str]:
    """The Slurm and munge programs not found on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [name for name in DAEMONS if shutil.which(name, path=path) is None]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _conf(root: Path, host: str, ports: dict[str, int]) -> str:
    lines = [
        "ClusterName=meshtrain-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports['ctld']}",
        # cred_expire: also how long a requeued job waits before it starts again (120 s)
        "AuthType=auth/munge", f"AuthInfo=socket={root}/munge.sock,cred_expire=10",
        "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool.%n",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides", "ReturnToService=2", "SlurmdTimeout=10",
        "JobRequeue=1", "MinJobAge=600", "KillWait=5", "MpiDefault=none",
        "SchedulerType=sched/backfill", "InactiveLimit=0", "SlurmctldTimeout=30",
        # a requeued job waits for the backfill pass (30 s by default; the tier's node-failure
        # tests spent up to 36 s there): a test cluster of 2 nodes affords one a second
        "SchedulerParameters=bf_interval=1,sched_min_interval=100000",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
    ]
    for name in NODES:
        lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 "
                     f"Port={ports[name]} CPUs=4 RealMemory=1000 State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE "
                 "State=UP OverSubscribe=YES")
    return "\n".join(lines) + "\n"


@dataclass
class SlurmCluster:
    """A started cluster; `env` is what a client needs (SLURM_CONF) on top of os.environ."""

    root: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: list = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {done.stderr}")
        return done.stdout

    def _start(self, key: str, argv: list[str]) -> None:
        log = open(self.root / f"{key}.out", "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs[key] = subprocess.Popen(argv, env=self.env, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "state").mkdir(exist_ok=True)
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        ports = {"ctld": free_port(), **{name: free_port() for name in NODES}}
        self.conf.write_text(_conf(self.root, socket.gethostname(), ports))
        self._start("munged", ["munged", "-F", "-f", f"--socket={self.root}/munge.sock",
                               f"--key-file={key}", f"--pid-file={self.root}/munged.pid",
                               f"--log-file={self.root}/munged.log",
                               f"--seed-file={self.root}/munge.seed"])
        self._wait_for(lambda: (self.root / "munge.sock").exists(), "munged's socket")
        self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in NODES:
            self.start_node(name)
        self._wait_for(self.all_idle, "both nodes idle")

    def start_node(self, name: str) -> None:
        self._start(name, ["slurmd", "-D", "-f", str(self.conf), "-N", name])

    def kill_node(self, name: str) -> None:
        """A node failure: SIGKILL its slurmd and every process running on it."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()
        for pid in _pids_with_env(f"SLURMD_NODENAME={name}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def node_states(self) -> list[str]:
        return self.run("sinfo", "-h", "-N", "-o", "%t", check=False).split()

    def all_idle(self) -> bool:
        states = self.node_states()
        return len(states) == len(NODES) and all(s == "idle" for s in states)

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise ClusterError(f"{dead[0]} exited while waiting for {what}\n{self.log_text()}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterError(f"no {what} after {START_SECONDS}s\n{self.log_text()}")

    def log_text(self) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Every daemon by its pid (slurmd first), then the step daemons they left."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root", check=False)
        for key in [*NODES, "slurmctld", "munged"]:
            proc = self.procs.pop(key, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid in _pids_with_env(f"SLURM_CONF={self.conf}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for log in self.logs:
            log.close()


def _pids_with_env(entry: str) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        if int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.encode() in environ:
            found.append(int(proc.name))
    return found
