"""One host of a Slurm job: run on every node by srun (``python -m
meshtrain.backends.slurm.node JOB_DIR``).

The node with SLURM_NODEID=i is host ``spec.hosts[i]`` (algo-i+1); it records which Slurm node it
is in ``nodes/<host>``, starts the runtime's bootstrap in that host's /opt/ml tree under the
shared job directory, and copies its output into ``logs/<host>.log`` and the merged job.log.
The first node picks the rendezvous port and writes it beside the job (a shared filesystem).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from meshtrain.backends.hosts.ft_logs import debug_log, is_torchft_debug
from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder, source_root
from meshtrain.backends.slurm.commands import expand_nodelist, node_address
from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.failures import HOST_RECORD, RankFailure, write_host_record
from meshtrain.contract.job_environment import MESHTRAIN_JOB_ENVIRONMENT

RENDEZVOUS_WAIT_SECONDS = 120
GROUP_HOSTS_ENV = "MESHTRAIN_SLURM_HOSTS"
"""The hosts this srun runs, in node order (a replica group's in a fault-tolerant job)."""


def rendezvous_file(job_dir: JobDirectory) -> Path:
    """Where the first node writes ADDR:PORT for this run of the job (a requeue runs again)."""
    run = f"{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    step = os.environ.get("SLURM_STEP_ID", "0")
    return job_dir.root / "rendezvous" / f"{run}.{step}"


def rendezvous(job_dir: JobDirectory, node_id: int) -> tuple[str, int]:
    """The first node's address and a port free on it."""
    where = rendezvous_file(job_dir)
    if node_id == 0:
        first = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])[0]
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.with_suffix(".tmp")
        tmp.write_text(f"{node_address(first)}:{port}")
        tmp.replace(where)
    deadline = time.monotonic() + RENDEZVOUS_WAIT_SECONDS
    while not where.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the first node wrote no rendezvous address to {where}")
        time.sleep(0.2)
    addr, port = where.read_text().rsplit(":", 1)
    return addr, int(port)


def host_environment(job_dir: JobDirectory, host: str, addr: str, port: int) -> dict[str, str]:
    spec = job_dir.read_spec().with_environment_from(os.environ)  # values: sbatch's environment
    env = dict(os.environ)
    env.pop(MESHTRAIN_JOB_ENVIRONMENT, None)  # the values themselves follow
    env.update(spec.environment)
    env.update({  # after the user's environment: these must not be overridden
        names.SAGEMAKER_BASE_DIR: str(job_dir.host_paths(host).base),
        names.MESHTRAIN_MASTER_ADDR: addr,
        names.MESHTRAIN_MASTER_PORT: str(port),
        names.MESHTRAIN_HOST_WORK_DIR: str(job_dir.host_work_dir(host)),
        names.TRAINING_JOB_NAME: spec.job_name,
        names.SM_CHECKPOINT_DIR: str(checkpoint_folder(spec, job_dir)),
        names.MESHTRAIN_ATTEMPT: os.environ.get("MESHTRAIN_ATTEMPT", "1"),
        names.MESHTRAIN_SOURCE_DIR: source_root(spec),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def copy_output(proc: subprocess.Popen, job_dir: JobDirectory, host: str) -> None:
    """The host's output into its own log and the merged job log (lines appended whole); a
    replica group's torchft lines into the group's debug file instead (hosts/ft_logs.py)."""
    job_dir.host_log(host).parent.mkdir(parents=True, exist_ok=True)
    group = os.environ.get(names.MESHTRAIN_FT_REPLICA_GROUP)
    debug_path = debug_log(job_dir, group) if group is not None else os.devnull
    Path(debug_path).parent.mkdir(parents=True, exist_ok=True)
    with open(job_dir.host_log(host), "ab") as own, open(job_dir.log_file, "ab") as merged, \
            open(debug_path, "ab") as debug:
        for line in iter(proc.stdout.readline, b""):
            own.write(line)
            own.flush()
            prefixed = line if line.startswith(b"[algo-") else f"[{host}] ".encode() + line
            sink = debug if group is not None and is_torchft_debug(line) else merged
            sink.write(prefixed)
            sink.flush()


def main() -> int:
    job_dir = JobDirectory(Path(sys.argv[1]))
    spec = job_dir.read_spec()
    node_id = int(os.environ["SLURM_NODEID"])
    hosts = os.environ.get(GROUP_HOSTS_ENV, "").split(",") if os.environ.get(
        GROUP_HOSTS_ENV) else list(spec.hosts)
    host, node = hosts[node_id], os.environ.get("SLURMD_NODENAME", "?")
    (job_dir.root / "nodes").mkdir(exist_ok=True)
    (job_dir.root / "nodes" / host).write_text(node)
    addr, port = rendezvous(job_dir, node_id)
    job_dir.host_work_dir(host).mkdir(parents=True, exist_ok=True)
    try:
        env = host_environment(job_dir, host, addr, port)
    except ConfigError as error:  # the environment's values did not reach this node
        return record_host_failure(job_dir, host, f"ClientError: {error}")
    proc = subprocess.Popen([sys.executable, "-m", names.BOOTSTRAP_MODULE], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    # srun's SIGTERM (scancel, --time) goes on to the bootstrap, which passes it to the ranks
    signal.signal(signal.SIGTERM, lambda *_: _forward(proc, signal.SIGTERM))
    copy_output(proc, job_dir, host)
    return proc.wait()


def record_host_failure(job_dir: JobDirectory, host: str, message: str) -> int:
    """A host that could not start: its failure record (the job's FailureReason names it);
    the exit code 1."""
    failure = RankFailure(host, None, time.time(), "host", message)
    write_host_record(job_dir.host_work_dir(host) / HOST_RECORD, host, 1, [failure])
    return 1


def _forward(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


if __name__ == "__main__":
    sys.exit(main())
