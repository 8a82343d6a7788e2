"""The process that runs one local job: starts every host, watches them, ends them cleanly.

Started detached by the local backend (``python -m meshtrain.backends.local_supervisor DIR``) so a
job outlives the client that submitted it, as a SageMaker job does. It merges host output into
job.log, stops the other hosts when one fails, enforces max_run, packs model.tar.gz and
output.tar.gz, and records the outcome in status.json.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from meshtrain.backends.local_artifacts import package_artifacts
from meshtrain.backends.local_layout import JobDirectory
from meshtrain.backends.processes import kill_job_processes, terminate_groups
from meshtrain.contract import env as names
from meshtrain.contract.jobspec import JobSpec

STOP_GRACE_SECONDS = 10.0
FAILURE_REASON_LIMIT = 1024  # SageMaker keeps the first 1024 characters of the failure file


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def host_environment(spec: JobSpec, job_dir: JobDirectory, host: str, port: int) -> dict:
    env = dict(os.environ)
    env.update(spec.environment)
    env.update({
        names.SAGEMAKER_BASE_DIR: str(job_dir.host_paths(host).base),
        names.MESHTRAIN_MASTER_ADDR: "127.0.0.1",
        names.MESHTRAIN_MASTER_PORT: str(port),
        names.MESHTRAIN_JOB_NAME: spec.job_name,
        names.TRAINING_JOB_NAME: spec.job_name,
        "PYTHONUNBUFFERED": "1",
    })
    if spec.checkpoint_local_path:
        env[names.SM_CHECKPOINT_DIR] = spec.checkpoint_local_path
    return env


class Supervisor:
    """Runs the hosts of one job and records how it ended."""

    def __init__(self, job_dir: JobDirectory) -> None:
        self.job_dir = job_dir
        self.spec = job_dir.read_spec()
        self.hosts: dict[str, subprocess.Popen] = {}
        self.stop_requested = threading.Event()
        self.log_lock = threading.Lock()

    def start_hosts(self) -> list[threading.Thread]:
        port = free_port()
        readers = []
        for host in self.spec.hosts:
            proc = subprocess.Popen(
                [sys.executable, "-m", "meshtrain_runtime.bootstrap"],
                env=host_environment(self.spec, self.job_dir, host, port),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.hosts[host] = proc
            reader = threading.Thread(target=self._pump, args=(host, proc), daemon=True)
            reader.start()
            readers.append(reader)
        return readers

    def _pump(self, host: str, proc: subprocess.Popen) -> None:
        """Copy one host's output into its own log and the merged job log, line by line."""
        host_log = self.job_dir.host_log(host)
        host_log.parent.mkdir(parents=True, exist_ok=True)
        with open(host_log, "ab") as own, open(self.job_dir.log_file, "ab") as merged:
            for line in iter(proc.stdout.readline, b""):
                own.write(line)
                own.flush()
                prefixed = line if line.startswith(b"[algo-") else f"[{host}] ".encode() + line
                with self.log_lock:
                    merged.write(prefixed)
                    merged.flush()

    def watch(self) -> tuple[str, str | None]:
        """Wait for the hosts; return (final status, failure reason)."""
        deadline = time.monotonic() + self.spec.max_run
        while True:
            codes = {host: proc.poll() for host, proc in self.hosts.items()}
            failed = [h for h, code in codes.items() if code not in (None, 0)]
            if self.stop_requested.is_set():
                return "Stopped", None
            if failed:
                return "Failed", self._failure_reason(failed[0], codes[failed[0]])
            if all(code == 0 for code in codes.values()):
                return "Completed", None
            if time.monotonic() > deadline:
                limit = self.spec.max_run
                return "Stopped", f"MaxRuntimeExceeded: the job ran past max_run={limit}s"
            time.sleep(0.2)

    def _failure_reason(self, host: str, code: int) -> str:
        failure = self.job_dir.host_paths(host).failure_file
        text = failure.read_text(errors="replace").strip() if failure.exists() else ""
        if not text:
            text = f"host {host} exited with code {code} without writing a failure reason"
        return f"AlgorithmError: ({host}) {text}"[:FAILURE_REASON_LIMIT]

    def end_hosts(self) -> None:
        pgids = [proc.pid for proc in self.hosts.values() if proc.poll() is None]
        terminate_groups(pgids, STOP_GRACE_SECONDS)
        kill_job_processes(self.spec.job_name, grace_seconds=STOP_GRACE_SECONDS)
        for proc in self.hosts.values():
            proc.wait()

    def run(self) -> None:
        self.job_dir.write_status(TrainingStartTime=time.time())
        self.job_dir.add_transition("Training", "Training image download completed. Training in "
                                                "progress.")
        readers = self.start_hosts()
        status, reason = self.watch()
        self.end_hosts()
        for reader in readers:
            reader.join(timeout=5)
        self.job_dir.add_transition("Uploading", "Uploading generated training model")
        package_artifacts(self.spec, self.job_dir)
        changes = {"TrainingJobStatus": status, "TrainingEndTime": time.time()}
        if reason:
            changes["FailureReason"] = reason
        self.job_dir.write_status(**changes)
        self.job_dir.add_transition(status, _FINAL_MESSAGES[status])


_FINAL_MESSAGES = {
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopped": "Training job stopped",
}


def main() -> None:
    job_dir = JobDirectory(Path(sys.argv[1]))
    supervisor = Supervisor(job_dir)
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stop_requested.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stop_requested.set())
    try:
        supervisor.run()
    except BaseException as error:  # record it: a client waits on status.json
        job_dir.write_status(TrainingJobStatus="Failed",
                             FailureReason=f"InternalServerError: local supervisor: {error!r}")
        kill_job_processes(supervisor.spec.job_name, grace_seconds=1)
        raise


if __name__ == "__main__":
    main()
