"""The process that runs one job on this machine: starts every host, watches them, ends them.

Each backend whose hosts run on this machine (local processes, Docker containers) has a module
that runs it detached (``python -m meshtrain.backends.local.supervisor DIR``) so a job outlives
the client that submitted it, as a SageMaker job does; this shared part merges host output into
job.log, stops the other hosts when one fails, restarts every host together after a failure
(``torch_distributed.max_restarts``; with ``fault_tolerance`` only the failed replica group's
hosts, see ft_run.py), stops hosts with a grace period (SIGTERM, then SIGKILL after
``torch_distributed.stop_grace_seconds``), enforces max_run, packs model.tar.gz and
output.tar.gz, and records the outcome in status.json.

It and everything below it carry the job's token (MESHTRAIN_JOB_TOKEN); its sweeps end only
processes with that token. When hosts fail it blames the earliest primary failure across the
hosts' records (meshtrain.contract.failures). See docs/local-jobs.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from meshtrain.backends.hosts.artifacts import output_location, package_artifacts
from meshtrain.backends.hosts.ft_logs import debug_log, is_torchft_debug
from meshtrain.backends.hosts.ft_run import FaultTolerantRun
from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder
from meshtrain.backends.hosts.processes import kill_job_processes, stop_groups_gracefully
from meshtrain.backends.hosts.replica_groups import replica_groups_of
from meshtrain.backends.hosts.restarts import (
    STOP_MARGIN_SECONDS,
    STOPPED_BY_CLIENT,
    restart_after_failure,
)
from meshtrain.backends.hosts.s3_staging import upload_results
from meshtrain.contract import env as names
from meshtrain.contract.failures import (
    HOST_RECORD,
    HOST_STOPPED_EXIT_CODE,
    RankFailure,
    format_reason,
    pick_root_cause,
    read_host_record,
)
from meshtrain.contract.job_environment import scrub
from meshtrain.contract.jobspec import JobSpec

STOP_GRACE_SECONDS = 10.0  # the last sweep, after the hosts' own grace period
# After the first host fails, the others get this long to fail on their own and record why
# (a rank's death shows on its peers a moment later) before they are stopped.
FAILURE_SETTLE_SECONDS = 5.0
FAILURE_REASON_LIMIT = 1024  # SageMaker keeps the first 1024 characters of the failure file
ALGORITHM_ERROR = "AlgorithmError: "
TAIL_LINES = 30
FULL_DISK_BYTES = 1 << 20  # less free space than this under the job directory: a full disk


class HostSupervisor:
    """Runs the hosts of one job and records how it ended; a backend says how a host starts
    (`host_process`) and, if not as a process tree, how it ends (`end_hosts`)."""

    label = "supervisor"
    """How a crash of this supervisor is named in the job's FailureReason."""

    @staticmethod
    def release_job(token: str) -> None:
        """What must go when this supervisor ends, whatever happened (host processes end with
        their supervisor: nothing to do here)."""

    def __init__(self, job_dir: JobDirectory) -> None:
        self.job_dir = job_dir
        self.spec = job_dir.read_spec().with_environment_from(os.environ)  # values restored
        self.token = job_dir.read_token()
        self.hosts: dict[str, subprocess.Popen] = {}
        self.host_extra_env: dict[str, dict[str, str]] = {}  # a replica group's, per host
        self.tails: dict[str, deque[str]] = {}
        self.failed_hosts: list[str] = []  # hosts that failed before any was stopped
        self.resource_fault: str | None = None
        self.stop_requested = threading.Event()
        self.log_lock = threading.Lock()
        torch_distributed = self.spec.distribution_config().torch_distributed
        self.max_restarts = torch_distributed.max_restarts
        self.grace_seconds = float(torch_distributed.stop_grace_seconds)

    def prepare_attempt(self, attempt: int) -> None:
        """What every host of one attempt shares, made before any starts (a rendezvous port,
        a network)."""

    def host_process(self, host: str, attempt: int) -> tuple[list[str], dict[str, str] | None]:
        """The argv and environment (None: this process's) that run `host`."""
        raise NotImplementedError

    def start_hosts(self, attempt: int = 1) -> list[threading.Thread]:
        """Start every host from this (main) thread: the hosts' lifeline (PR_SET_PDEATHSIG)
        fires when the thread that started them ends. Each attempt starts afresh."""
        self.hosts, self.tails, self.failed_hosts = {}, {}, []
        checkpoint_folder(self.spec, self.job_dir).mkdir(parents=True, exist_ok=True)
        self.prepare_attempt(attempt)
        return [self.start_host(host, attempt) for host in self.spec.hosts]

    def start_host(self, host: str, attempt: int) -> threading.Thread:
        """Start one host (from the main thread) and the thread that copies its output."""
        self.job_dir.host_work_dir(host).mkdir(parents=True, exist_ok=True)
        argv, env = self.host_process(host, attempt)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self.hosts[host] = proc
        self.tails[host] = deque(maxlen=TAIL_LINES)
        reader = threading.Thread(target=self._pump, args=(host, proc), daemon=True)
        reader.start()
        return reader

    def prepare_group(self, group: int, attempt: int) -> None:
        """What the hosts of one replica group share, made before they start (a fault-tolerant
        job: each group is a torchrun world of its own, with its own rendezvous)."""

    def _pump(self, host: str, proc: subprocess.Popen) -> None:
        """Copy one host's output into its own log and the merged job log, line by line.
        A log that cannot be written (a full disk) fails the job, but the output is still
        read to the end so that the host never blocks on a full pipe."""
        host_log = self.job_dir.host_log(host)
        group = self.host_extra_env.get(host, {}).get(names.MESHTRAIN_FT_REPLICA_GROUP)
        own = merged = debug = None
        try:
            host_log.parent.mkdir(parents=True, exist_ok=True)
            own, merged = open(host_log, "ab"), open(self.job_dir.log_file, "ab")  # noqa: SIM115
            if group is not None:  # a replica group's host: torchft's lines go aside
                debug_log(self.job_dir, group).parent.mkdir(parents=True, exist_ok=True)
                debug = open(debug_log(self.job_dir, group), "ab")  # noqa: SIM115
        except OSError as error:
            self._log_fault(host_log, error)
        for line in iter(proc.stdout.readline, b""):
            self.tails[host].append(line.decode(errors="replace"))
            if own is None or merged is None or self.resource_fault:
                continue
            prefixed = line if line.startswith(b"[algo-") else f"[{host}] ".encode() + line
            sink = debug if debug is not None and is_torchft_debug(line) else merged
            target = host_log
            try:
                own.write(line)
                own.flush()
                target = self.job_dir.log_file
                with self.log_lock:
                    sink.write(prefixed)
                    sink.flush()
            except OSError as error:
                self._log_fault(target, error)
        for handle in (own, merged, debug):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()

    def _log_fault(self, path: Path, error: OSError) -> None:
        if self.resource_fault is None:
            self.resource_fault = (f"ClientError: could not write the job's logs to {path}: "
                                   f"[Errno {error.errno}] {error.strerror or error}")

    def watch(self, deadline: float | None = None) -> tuple[str, str | None]:
        """Wait for the hosts; return (final status, failure reason or None to look it up)."""
        deadline = deadline or time.monotonic() + self.spec.max_run
        while True:
            codes = {host: proc.poll() for host, proc in self.hosts.items()}
            failed = [h for h, code in codes.items() if code not in (None, 0)]
            if self.stop_requested.is_set():
                return "Stopped", STOPPED_BY_CLIENT
            stopped = [h for h, code in codes.items() if code == HOST_STOPPED_EXIT_CODE]
            if stopped:
                return "Stopped", (f"HostStopped: host {stopped[0]} received SIGTERM (a "
                                   "reclaimed instance); every host was stopped")
            if failed or self.resource_fault:
                self._settle()
                self.failed_hosts = [h for h, p in self.hosts.items() if p.poll() not in (None, 0)]
                return "Failed", None
            if all(code == 0 for code in codes.values()):
                return "Completed", None
            if time.monotonic() > deadline:
                limit = self.spec.max_run
                return "Stopped", f"MaxRuntimeExceeded: the job ran past max_run={limit}s"
            time.sleep(0.2)

    def _settle(self) -> None:
        deadline = time.monotonic() + FAILURE_SETTLE_SECONDS
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if all(proc.poll() is not None for proc in self.hosts.values()):
                return
            time.sleep(0.1)

    def failure_reason(self) -> str:
        """Why the job failed: the hosts' root cause, then a fault of the supervisor's own
        (a log it could not write), cut to SageMaker's 1024 characters."""
        parts = [self._full_disk_note()]
        parts += [self._hosts_reason()] if self.failed_hosts else []
        parts += [self.resource_fault]
        return "\n".join(p for p in parts if p)[:FAILURE_REASON_LIMIT]

    def _full_disk_note(self) -> str | None:
        """A full disk under the job directory is the likely cause of whatever failed there
        (scripts' write errors rarely name their path): say so first."""
        try:
            free = shutil.disk_usage(self.job_dir.root).free
        except OSError:
            return None
        if free >= FULL_DISK_BYTES:
            return None
        return (f"ClientError: the disk of the job directory {self.job_dir.root} is full "
                f"({free} bytes free): No space left on device.")

    def _hosts_reason(self) -> str:
        """The earliest root cause across every host's record, and who failed after it."""
        failures: list[RankFailure] = []
        for host in self.hosts:
            failures += read_host_record(self.job_dir.host_work_dir(host) / HOST_RECORD)
        limit = FAILURE_REASON_LIMIT - len(ALGORITHM_ERROR)
        if failures:
            root, others = pick_root_cause(failures)
            return ALGORITHM_ERROR + format_reason(root, others, limit)
        host = self.failed_hosts[0]
        failure = self.job_dir.host_paths(host).failure_file
        text = ""
        with contextlib.suppress(OSError):
            text = failure.read_text(errors="replace").strip()
        if not text:  # no record at all (a full disk): the host's last lines of output
            code = self.hosts[host].returncode
            tail = "".join(self.tails.get(host, ()))
            text = f"host {host} exited with code {code} and left no failure record\n{tail}"
        return f"{ALGORITHM_ERROR}({host}) {text}"[:FAILURE_REASON_LIMIT]

    def end_hosts(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM every host still running (its bootstrap passes it to torchrun, which passes
        it to the ranks and waits for them up to the grace period), SIGKILL what is left after
        `grace_seconds` or once the ranks have ended, then sweep the token."""
        pgids = [proc.pid for proc in self.hosts.values() if proc.poll() is None]
        stop_groups_gracefully(pgids, self.token, grace_seconds)
        kill_job_processes(self.token, grace_seconds=STOP_GRACE_SECONDS)
        for proc in self.hosts.values():
            proc.wait()

    def run_attempt(self, attempt: int, deadline: float) -> tuple[str, str | None]:
        """Run every host once; end them all; return (status, reason)."""
        readers = self.start_hosts(attempt)
        status, reason = self.watch(deadline)
        # a failed attempt's survivors are ended at once; a stop gives the ranks their grace
        self.end_hosts(self.grace_seconds + STOP_MARGIN_SECONDS if status == "Stopped"
                       else STOP_GRACE_SECONDS)
        for reader in readers:
            reader.join(timeout=5)
        if status == "Failed" and reason is None:
            reason = self.failure_reason()
        return status, reason

    def run(self) -> None:
        self.job_dir.write_status(TrainingStartTime=time.time())
        self.job_dir.add_transition("Training", TRAINING_MESSAGE)
        deadline = time.monotonic() + self.spec.max_run  # max_run counts every attempt
        if replica_groups_of(self.spec):  # each replica group fails and restarts alone
            run = FaultTolerantRun(self)
            status, reason = run.run(deadline)
            finish_job(self.job_dir, self.spec, status, reason, model_hosts=run.model_hosts())
            return
        attempt = 1
        status, reason = self.run_attempt(attempt, deadline)
        while (status == "Failed" and attempt <= self.max_restarts and not self.resource_fault
               and not self.stop_requested.is_set()):
            restart_after_failure(self.job_dir, self.spec, attempt, reason or "", self.log_lock)
            attempt += 1
            self.job_dir.add_transition("Training", f"Attempt {attempt} of "
                                                    f"{self.max_restarts + 1} in progress")
            status, reason = self.run_attempt(attempt, deadline)
        finish_job(self.job_dir, self.spec, status, reason)


def finish_job(job_dir: JobDirectory, spec: JobSpec, status: str, reason: str | None, *,
               model_hosts: list[str] | None = None) -> None:
    """A host job's end, whatever launched its hosts: pack and upload what it wrote (a failure
    there fails a completed job; `model_hosts`: whose model folders, default every host's),
    then record the final status and its transition."""
    job_dir.add_transition("Uploading", "Uploading generated training model")
    packing_error = package_artifacts(spec, job_dir, model_hosts) or upload_results(
        job_dir.root, spec.job_name, output_location(spec, job_dir),
        checkpoint_folder(spec, job_dir))
    if packing_error:
        status = "Failed" if status == "Completed" else status
        reason = f"{reason}\n{packing_error}" if reason else packing_error
    changes = {"TrainingJobStatus": status, "TrainingEndTime": time.time()}
    if reason:  # a traceback that printed an environment value does not keep it
        changes["FailureReason"] = scrub(reason, spec.environment)[:FAILURE_REASON_LIMIT]
    job_dir.write_status(**changes)
    job_dir.add_transition(status, _FINAL_MESSAGES[status])


TRAINING_MESSAGE = "Training in progress."
"""The Training transition of a job whose hosts run here (SageMaker's says "Training image
download completed. Training in progress.": these hosts download no image)."""


_FINAL_MESSAGES = {
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopped": "Training job stopped",
}


def supervise(supervisor_class: type[HostSupervisor]) -> None:
    """A supervisor process's entry (``python -m <module> JOB_DIR``): run the job; a crash of
    the supervisor itself ends the job's processes and is recorded as the job's failure."""
    job_dir = JobDirectory(Path(sys.argv[1]))
    token = job_dir.read_token()
    try:
        supervisor = supervisor_class(job_dir)
        signal.signal(signal.SIGTERM, lambda *_: supervisor.stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: supervisor.stop_requested.set())
        supervisor.run()
    except BaseException as error:  # record it: a client waits on status.json
        kill_job_processes(token, grace_seconds=1)
        with contextlib.suppress(OSError):
            job_dir.write_status(TrainingJobStatus="Failed", TrainingEndTime=time.time(),
                                 FailureReason=f"InternalServerError: {supervisor_class.label}: "
                                               f"{error!r}")
        raise
    finally:
        with contextlib.suppress(Exception):
            supervisor_class.release_job(token)

