"""The submitting side of a fault-tolerant Slurm job (submit.py runs this for a job with
``torch_distributed.fault_tolerance``): the lighthouse, one sbatch job per replica group, and
the job's outcome.

It starts torchft's lighthouse on this machine (by its pid, bound to the address the nodes reach
it at, told to the ranks as ``http://<that address>:<port>``), renders and sbatches each group's
script (script.render_group: its hosts, MESHTRAIN_FT_* and ``--requeue``, so Slurm requeues a
group whose node died alone), then follows the N Slurm jobs until none runs. What it decides
is the coordinator's (hosts/ft_coordinator.py), as for local jobs: the groups' ends (from their
batch steps' outcomes), which groups are stopped once one finished (scancel), the outcome,
the log lines and the figures of describe()["FaultTolerance"]. Slurm's own part: a group's job
that ended with its node without a record is requeued here (Slurm requeues it only when it
marked the node down), up to the group's budget.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from typing import Any

from meshtrain.backends.hosts.ft_coordinator import (
    LOST,
    RUNNING,
    STOPPED,
    GroupRun,
    ReplicaGroupCoordinator,
    coordination_dir,
)
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.lighthouse import Lighthouse, LighthouseError
from meshtrain.backends.hosts.replica_groups import ft_environment
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS, STOPPED_BY_CLIENT
from meshtrain.backends.hosts.supervisor import finish_job
from meshtrain.backends.slurm import groups as records
from meshtrain.backends.slurm.commands import (
    ENDED_STATES,
    address_towards_nodes,
    job_fields,
    run_slurm,
)
from meshtrain.backends.slurm.script import SlurmOptions, group_script_name, render_group

OPTIONS_FILE = "slurm_options.json"
POLL_SECONDS = 1.0


def write_options(job_dir: JobDirectory, options: SlurmOptions) -> None:
    """The backend options, for the group scripts rendered once the lighthouse listens."""
    (job_dir.root / OPTIONS_FILE).write_text(json.dumps(options.__dict__))


def group_ended(fields: dict[str, str]) -> str | None:
    """Slurm's final state of a group's job (None while it runs, waits or is requeued)."""
    if not fields:
        return "UNKNOWN"  # Slurm no longer knows it
    state = fields.get("JobState", "")
    if state == "NODE_FAIL" and fields.get("Requeue") == "1":
        return None
    return state if state in ENDED_STATES else None


class FaultTolerantSubmission:
    """One fault-tolerant job's lighthouse and replica-group jobs."""

    def __init__(self, job_dir: JobDirectory) -> None:
        self.job_dir = job_dir
        self.spec = job_dir.read_spec()
        self.policy = ReplicaGroupCoordinator(self.spec, job_dir)
        self.options = SlurmOptions(**json.loads((job_dir.root / OPTIONS_FILE).read_text()))
        address = address_towards_nodes(self.options.partition)  # not every interface
        self.lighthouse = Lighthouse(job_dir.root / "lighthouse.log",
                                     bind_host=address or "0.0.0.0",
                                     advertise_host=address or socket.gethostname(),
                                     fault_tolerance=self.policy.ft)
        self.job_ids: list[str] = []
        self.ended: set[int] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            address = self.lighthouse.start()
            self.job_dir.write_status(TrainingStartTime=time.time(),
                                      FaultToleranceLayout=self.policy.layout_status(
                                          address, self.lighthouse.pid))
            self.policy.log(f"fault tolerance: {len(self.policy.groups)} replica groups, "
                            f"lighthouse {address} (pid {self.lighthouse.pid})")
            self.submit_groups(address)
            stopped = self.watch()
        except (LighthouseError, RuntimeError, OSError) as error:
            self.cancel()
            self.lighthouse.stop()
            finish_job(self.job_dir, self.spec, "Failed", f"ClientError: {error}")
            return
        self.lighthouse.stop()
        self.report()
        finish_job(self.job_dir, self.spec, *self.policy.outcome(stopped),
                   model_hosts=self.policy.model_hosts())

    def submit_groups(self, address: str) -> None:
        """Render and sbatch each group's script (RuntimeError with sbatch's words)."""
        folder = coordination_dir(self.job_dir)
        for group in self.policy.groups:
            script = self.job_dir.root / group_script_name(group.index)
            script.write_text(render_group(
                self.spec, self.job_dir, self.job_dir.read_token(), self.options, group.index,
                group.hosts, ft_environment(group.index, self.policy.ft, address, folder)))
            out = run_slurm("sbatch", "--parsable", str(script))
            self.job_ids.append(out.strip().split(";")[0])
            records.write_job_ids(self.job_dir, self.job_ids)
        self.job_dir.add_transition("Training", f"Submitted {len(self.job_ids)} replica groups "
                                                f"as Slurm jobs {', '.join(self.job_ids)}")

    def watch(self) -> str | None:
        """Follow the groups' jobs until none runs; the reason of a stop, if one came."""
        stop_deadline: float | None = None
        while True:
            self.follow_groups()
            if len(self.ended) == len(self.job_ids):
                return STOPPED_BY_CLIENT if stop_deadline is not None else None
            if stop_deadline is None and (self.stop.is_set()
                                          or self.job_dir.stop_request_file.exists()):
                grace = self.spec.distribution_config().torch_distributed.stop_grace_seconds
                stop_deadline = time.monotonic() + grace + STOP_MARGIN_SECONDS + 30
                self.cancel("--signal=TERM", "--full")
            elif stop_deadline is not None and time.monotonic() > stop_deadline:
                self.cancel()
            for group in self.policy.to_stop():
                group.state = STOPPED
                with contextlib.suppress(RuntimeError):
                    run_slurm("scancel", self.job_ids[group.index])
            self.report()
            time.sleep(POLL_SECONDS)

    def follow_groups(self) -> None:
        """A group's recorded outcome is its end for the policy; its Slurm job's end is when
        nothing of it runs any more."""
        for group in self.policy.groups:
            outcome = records.read_outcome(self.job_dir, group.index)
            if group.state == RUNNING and outcome is not None:
                self._apply(group, outcome)
            if group.index in self.ended:
                continue
            try:
                fields = job_fields(self.job_ids[group.index])
            except RuntimeError:
                continue  # Slurm cannot be asked now: ask again
            state = group_ended(fields)
            if state is not None and not self.requeue_lost_run(group, state, fields):
                self.ended.add(group.index)
                if group.state == RUNNING:  # its batch step recorded nothing
                    group.state, group.reason = LOST, f"its Slurm job ended {state}"

    def _apply(self, group: GroupRun, outcome: dict[str, Any]) -> None:
        if outcome.get("Status") == "Completed":
            self.policy.on_exit_zero(group)
        elif outcome.get("Status") == "Stopped":
            group.state, group.reason = STOPPED, outcome.get("FailureReason")
        else:
            group.state, group.reason = LOST, outcome.get("FailureReason")

    def requeue_lost_run(self, group: GroupRun, state: str, fields: dict[str, str]) -> bool:
        """Requeue a group's job whose batch step died with its node (no outcome recorded)
        and that Slurm did not requeue itself (a node back within SlurmdTimeout fails the job,
        JobLaunchFailure), within the group's budget; whether it was requeued."""
        restarts = int(fields.get("Restarts", "0") or 0)
        if (records.read_outcome(self.job_dir, group.index) is not None
                or state in ("COMPLETED", "CANCELLED", "TIMEOUT", "UNKNOWN")
                or self.stop.is_set() or self.job_dir.stop_request_file.exists()
                or not self.policy.may_restart(GroupRun(group.index, group.hosts,
                                                        attempt=restarts + 1))):
            return False
        job_id = self.job_ids[group.index]
        try:
            run_slurm("scontrol", "requeue", job_id)
        except RuntimeError:
            return False
        self.policy.log(f"replica group {group.index}: its Slurm job {job_id} ended {state} "
                        "without a record (its node failed); requeued")
        return True

    def cancel(self, *flags: str) -> None:
        for job_id in self.job_ids:
            with contextlib.suppress(RuntimeError):
                run_slurm("scancel", *flags, job_id)

    def report(self) -> None:
        """The groups' failures (each group's own file, plus its loss) and the figures."""
        events = records.read_events(self.job_dir, len(self.policy.groups))
        known = {e["ReplicaGroup"]: e for e in
                 self.job_dir.read_status().get("FaultToleranceEvents", []) if e.get("Lost")}
        for group in self.policy.groups:
            if group.state == LOST:  # a lost group keeps the time it was first seen lost
                events.append(known.get(group.index) or {
                    "ReplicaGroup": group.index, "FailedAt": time.time(), "Lost": True,
                    "FailureReason": (group.reason or "")[:1024]})
        self.policy.report(events)


def main(job_dir: JobDirectory) -> None:
    submission = FaultTolerantSubmission(job_dir)
    signal.signal(signal.SIGTERM, lambda *_: submission.stop.set())
    try:
        submission.run()
    finally:
        submission.lighthouse.stop()
