"""The batch step of a Slurm job (``python -m meshtrain.backends.slurm.batch JOB_DIR``, what
the sbatch script execs on the job's first node): srun one host per node, restart every host
after a failure up to ``torch_distributed.max_restarts``, pack model.tar.gz and record the
outcome in the shared job directory's status.json.

A requeued job (a node died: Slurm's JobRequeue) runs this again from the top with
SLURM_RESTART_COUNT > 0: the failed run's host records are moved aside and the hosts start
again over the same /opt/ml trees and checkpoint folder; status.json stays InProgress between.
max_run bounds the job across every run (from the first TrainingStartTime).

With ``fault_tolerance`` each replica group is a Slurm job of its own and runs this with its
group (``... batch JOB_DIR GROUP``): srun over the group's nodes only, a failed attempt restarts
only the group's hosts (``max_restarts`` per group; not once another group has finished), a
dead node requeues only the group's job, and the outcome goes to ``groups/<g>/`` (groups.py)
for the submitting side (ft_submit.py), which records the job's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from meshtrain.backends.hosts.layout import JobDirectory, checkpoint_folder
from meshtrain.backends.hosts.restarts import (
    STOP_MARGIN_SECONDS,
    archive_host_records,
    restart_after_failure,
)
from meshtrain.backends.hosts.supervisor import (
    ALGORITHM_ERROR,
    FAILURE_REASON_LIMIT,
    STOPPED_BY_CLIENT,
    TRAINING_MESSAGE,
    finish_job,
)
from meshtrain.backends.slurm.commands import (
    expand_nodelist,
    job_state,
    run_slurm,
    slurmd_started,
)
from meshtrain.backends.slurm.ft_group import GroupRecords
from meshtrain.backends.slurm.node import GROUP_HOSTS_ENV
from meshtrain.backends.slurm.submit import JOB_ID_FILE
from meshtrain.contract import env as names
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.failures import (
    HOST_RECORD,
    format_reason,
    pick_root_cause,
    read_host_record,
)
from meshtrain.contract.private_files import PRIVATE_FILE_MODE

REQUEUE = "Requeue"
NODE_PROBE_SECONDS = 30
NODE_SETTLE_SECONDS = 20  # a killed node's slurmd restarting registers within seconds


def nodes_respond(count: int) -> bool:
    """Every node of the allocation still runs a step (a dead node fails the launch)."""
    try:
        done = subprocess.run(["srun", f"--nodes={count}", "--ntasks-per-node=1", "true"],
                              capture_output=True, timeout=NODE_PROBE_SECONDS,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def requeue() -> None:
    """Put the job back in Slurm's queue (`scontrol requeue`): Slurm ends this run and starts
    the batch script again once the nodes are there (a node Slurm saw go down is requeued by
    Slurm itself: JobRequeue=1)."""
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        run_slurm("scontrol", "requeue", os.environ.get("SLURM_JOB_ID", ""))


def node_of(job_dir: JobDirectory, host: str) -> str:
    """The Slurm node a host ran on ('?' before it started)."""
    try:
        return (job_dir.root / "nodes" / host).read_text().strip()
    except OSError:
        return "?"


def hosts_reason(job_dir: JobDirectory, code: int, hosts: list[str]) -> str:
    """The root cause across the hosts' records, with the Slurm node of its host first."""
    failures = []
    for host in hosts:
        failures += read_host_record(job_dir.host_work_dir(host) / HOST_RECORD)
    nodes = ", ".join(f"{host} = Slurm node {node_of(job_dir, host)}" for host in hosts)
    if not failures:
        return (f"{ALGORITHM_ERROR}srun exited with code {code} and no host left a failure "
                f"record ({nodes}); see {job_dir.root}/slurm-*.out")
    root, others = pick_root_cause(failures)
    where = f"[{root.host} ran on Slurm node {node_of(job_dir, root.host)}; {nodes}]"
    limit = FAILURE_REASON_LIMIT - len(ALGORITHM_ERROR) - len(where) - 1
    return f"{ALGORITHM_ERROR}{where}\n{format_reason(root, others, limit)}"


class BatchStep:
    """One run of the batch script: attempts of srun over every node, then the outcome."""

    def __init__(self, job_dir: JobDirectory, group: int | None = None) -> None:
        self.job_dir = job_dir
        self.spec = job_dir.read_spec()
        with contextlib.suppress(ConfigError):  # the values, to keep them out of the reason
            self.spec = self.spec.with_environment_from(os.environ)  # (each node checks them)
        self.group = GroupRecords.of(job_dir, self.spec, group) if group is not None else None
        self.hosts = list(self.group.hosts) if self.group else list(self.spec.hosts)
        self.stop = threading.Event()
        self.srun: subprocess.Popen | None = None
        torch_distributed = self.spec.distribution_config().torch_distributed
        self.max_restarts = torch_distributed.max_restarts
        self.grace = float(torch_distributed.stop_grace_seconds)
        self.run_started = datetime.now()
        self.attempt_ended = time.time()

    def on_sigterm(self, *_: object) -> None:
        self.stop.set()
        if self.srun is not None and self.srun.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.srun.send_signal(signal.SIGTERM)  # srun passes it to every host

    def run_attempt(self, attempt: int, deadline: float) -> tuple[str, str | None]:
        checkpoint_folder(self.spec, self.job_dir).mkdir(parents=True, exist_ok=True)
        env = {**os.environ, names.MESHTRAIN_ATTEMPT: str(attempt),
               GROUP_HOSTS_ENV: ",".join(self.hosts)}
        self.srun = subprocess.Popen(
            ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", sys.executable, "-m",
             "meshtrain.backends.slurm.node", str(self.job_dir.root)],
            env=env, stdin=subprocess.DEVNULL)
        while self.srun.poll() is None:
            if time.time() > deadline and not self.stop.is_set():
                self.on_sigterm()
                self.srun.wait(timeout=self.grace + STOP_MARGIN_SECONDS)
                return "Stopped", (f"MaxRuntimeExceeded: the job ran past max_run="
                                   f"{self.spec.max_run}s")
            time.sleep(0.5)
        code = self.srun.returncode
        self.attempt_ended = time.time()  # a group's FailedAt: before the node checks below
        if self.stop.is_set():
            return self.after_sigterm(deadline)
        if code == 0:
            return "Completed", None
        if self.node_failed():
            requeue()
            return REQUEUE, None
        return "Failed", hosts_reason(self.job_dir, code, self.hosts)

    def node_failed(self) -> bool:
        """A node of the job died: its slurmd restarted since this run began, or a node does
        not run a step now. When a host left no failure record (its node step was killed, not a
        rank that raised), its slurmd is given NODE_SETTLE_SECONDS to show the restart: a probe
        step alone would wait for a slurmd that comes back and then succeed."""
        nodes = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST", ""))
        settle = time.monotonic() + (NODE_SETTLE_SECONDS if self.host_unrecorded() else 0)
        while True:
            if any(self.restarted(node) for node in nodes):
                return True
            if time.monotonic() >= settle:
                return not nodes_respond(len(nodes))
            time.sleep(1)

    def restarted(self, node: str) -> bool:
        started = slurmd_started(node)
        return started is not None and started > self.run_started

    def host_unrecorded(self) -> bool:
        return any(not (self.job_dir.host_work_dir(host) / HOST_RECORD).exists()
                   for host in self.hosts)

    def after_sigterm(self, deadline: float) -> tuple[str, str | None]:
        """Why Slurm sent SIGTERM: the client's stop(), --time, an scancel, or a node failure
        (the job is being requeued: nothing is recorded, the next run goes on)."""
        if self.job_dir.stop_request_file.exists():
            return "Stopped", STOPPED_BY_CLIENT
        state = job_state(os.environ.get("SLURM_JOB_ID", ""))
        if state == "TIMEOUT" or time.time() > deadline:
            return "Stopped", (f"MaxRuntimeExceeded: the job ran past max_run="
                               f"{self.spec.max_run}s (Slurm --time)")
        if state == "CANCELLED":
            return "Stopped", "StopRequested: the Slurm job was cancelled (scancel)"
        return REQUEUE, None

    def begin(self) -> float:
        """Record the start (first run) or the requeue; the deadline across every run."""
        if self.group is not None:
            return self.group.begin()
        (self.job_dir.root / JOB_ID_FILE).write_text(os.environ.get("SLURM_JOB_ID", ""))
        status = self.job_dir.read_status()
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        if "TrainingStartTime" not in status:
            status = self.job_dir.write_status(TrainingStartTime=time.time())
        if restarts:
            archive_host_records(self.job_dir, self.spec.hosts, 1000 + restarts)
            self.job_dir.add_transition("Training", f"Requeued by Slurm (run {restarts + 1}); "
                                                    "resuming from the checkpoint folder")
        else:
            self.job_dir.add_transition("Training", TRAINING_MESSAGE)
        return status["TrainingStartTime"] + self.spec.max_run

    def run(self) -> None:
        deadline = self.begin()
        attempt = 1
        status, reason = self.run_attempt(attempt, deadline)
        while status == "Failed" and self.may_restart(attempt):
            if self.group is not None:  # only this replica group's hosts
                self.group.restart(attempt, reason or "", self.attempt_ended)
            else:
                restart_after_failure(self.job_dir, self.spec, attempt, reason or "",
                                      threading.Lock())
            attempt += 1
            status, reason = self.run_attempt(attempt, deadline)
        if status == REQUEUE:
            status, reason = self.wait_for_requeue(deadline)
            if status == REQUEUE:
                return  # Slurm ends this run and starts the job again: nothing recorded
        self.finish(status, reason)

    def wait_for_requeue(self, deadline: float) -> tuple[str, str | None]:
        """A node of the job died: Slurm ends this run and requeues the job; status.json stays
        InProgress. Past max_run the job is recorded as Stopped instead."""
        with contextlib.suppress(OSError), open(self.job_dir.log_file, "ab") as log:
            log.write(b"[meshtrain] a node of the job failed; waiting for Slurm to requeue it\n")
        while time.time() < deadline and not self.stop.is_set():
            time.sleep(1)
        if time.time() >= deadline:
            return "Stopped", (f"MaxRuntimeExceeded: the job ran past max_run="
                               f"{self.spec.max_run}s (across Slurm's requeues)")
        return REQUEUE, None

    def may_restart(self, attempt: int) -> bool:
        """Within max_restarts and not after a stop; a replica group by the coordinator's rule
        (not once another group has finished)."""
        if self.group is not None:
            return self.group.may_restart(attempt, stopping=self.stop.is_set())
        return attempt <= self.max_restarts and not self.stop.is_set()

    def finish(self, status: str, reason: str | None) -> None:
        if self.group is not None:  # the submitting side records the job's end
            self.group.finish(status, reason)
            return
        finish_job(self.job_dir, self.spec, status, reason)


def make_output_private(job_dir: JobDirectory) -> None:
    """Slurm made the job's output file (slurm-<id>.out) with sbatch's umask, before the
    script's `umask 077` ran: a script submitted by hand from a umask 022 shell left it 0644."""
    output = job_dir.root / f"slurm-{os.environ.get('SLURM_JOB_ID', '')}.out"
    with contextlib.suppress(OSError):
        output.chmod(PRIVATE_FILE_MODE)


def main() -> None:
    group = int(sys.argv[2]) if len(sys.argv) > 2 else None
    make_output_private(JobDirectory(Path(sys.argv[1])))
    step = BatchStep(JobDirectory(Path(sys.argv[1])), group)
    signal.signal(signal.SIGTERM, step.on_sigterm)
    step.run()


if __name__ == "__main__":
    main()
