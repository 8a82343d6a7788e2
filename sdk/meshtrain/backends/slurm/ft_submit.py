"""The submitting side of a fault-tolerant Slurm job (submit.py runs this for a job with
``torch_distributed.fault_tolerance``): the lighthouse, one sbatch job per replica group, and
the job's outcome.

It starts torchft's lighthouse on this machine (by its pid, bound to the address the nodes reach
it at, told to the ranks as ``http://<that address>:<port>``), renders and sbatches each group's
script (script.render_group: its hosts, MESHTRAIN_FT_* and ``--requeue``, so Slurm requeues a
group whose node died alone), then follows the N Slurm jobs until none runs: it merges the
groups' failure records into status.json with the figures of describe()["FaultTolerance"] and
the progress line's ft:* values, requeues a group's job that ended with its node without a record
(Slurm requeues it only when it marked the node down), scancels groups still running
FINISH_WINDOW_SECONDS after one finished (and a requeued one at once), stops the lighthouse and
records the job's end: Completed when a group finished, Failed when every group was lost,
Stopped on a stop.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
import time
from typing import Any

from meshtrain.backends.hosts.ft_metrics import (
    fault_tolerance_summary,
    progress_metrics_line,
    read_step_records,
)
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.lighthouse import Lighthouse, LighthouseError
from meshtrain.backends.hosts.replica_groups import (
    ReplicaGroups,
    fault_tolerance_of,
    ft_environment,
)
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS
from meshtrain.backends.hosts.supervisor import STOPPED_BY_CLIENT, finish_job
from meshtrain.backends.slurm import groups as records
from meshtrain.backends.slurm.commands import (
    ENDED_STATES,
    address_towards_nodes,
    job_fields,
    run_slurm,
)
from meshtrain.backends.slurm.script import SlurmOptions, group_script_name, render_group

OPTIONS_FILE = "slurm_options.json"
FINISH_WINDOW_SECONDS = 60.0
POLL_SECONDS = 1.0
LOG_PREFIX = "[meshtrain] "


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


def job_outcome(outcomes: list[dict[str, Any] | None], stopped: bool) -> tuple[str, str | None]:
    """The job's end from its groups' (each None when its batch step recorded nothing):
    Completed when a group finished, Stopped on a stop, else Failed with the last reason."""
    if any(o and o.get("Status") == "Completed" for o in outcomes):
        return "Completed", None
    if stopped:
        return "Stopped", STOPPED_BY_CLIENT
    reasons = [f"replica group {g}: {(o or {}).get('FailureReason') or 'ended without a record'}"
               for g, o in enumerate(outcomes)]
    if any(o and o.get("Status") == "Stopped" for o in outcomes):
        return "Stopped", "; ".join(reasons)
    return "Failed", f"every replica group failed; the last: {reasons[-1]}"


class FaultTolerantSubmission:
    """One fault-tolerant job's lighthouse and replica-group jobs."""

    def __init__(self, job_dir: JobDirectory) -> None:
        self.job_dir = job_dir
        self.spec = job_dir.read_spec()
        self.token = job_dir.read_token()
        self.ft = fault_tolerance_of(self.spec)
        assert self.ft is not None  # submit.py runs this only for a fault-tolerant job
        self.layout = ReplicaGroups.of(list(self.spec.hosts), self.ft.replica_groups)
        self.options = SlurmOptions(**json.loads((job_dir.root / OPTIONS_FILE).read_text()))
        address = address_towards_nodes(self.options.partition)  # not every interface
        self.lighthouse = Lighthouse(job_dir.root / "lighthouse.log",
                                     bind_host=address or "0.0.0.0",
                                     advertise_host=address or socket.gethostname(),
                                     min_replicas=self.ft.min_replica_groups)
        self.job_ids: list[str] = []
        self.budget = self.spec.distribution_config().torch_distributed.max_restarts
        self.stop = threading.Event()
        self.first_done: float | None = None
        self._last_line = ""

    def run(self) -> None:
        try:
            address = self.lighthouse.start()
            self.job_dir.write_status(TrainingStartTime=time.time(), FaultToleranceLayout={
                "ReplicaGroupHosts": [list(g) for g in self.layout.groups],
                "Lighthouse": address, "LighthousePid": self.lighthouse.pid,
                "RestartsPerGroup": self.budget})
            self._log(f"fault tolerance: {self.layout.count} replica groups, lighthouse "
                      f"{address} (pid {self.lighthouse.pid})")
            self.submit_groups(address)
            stopped = self.watch()
        except (LighthouseError, RuntimeError, OSError) as error:
            self.cancel()
            self.lighthouse.stop()
            finish_job(self.job_dir, self.spec, "Failed", f"ClientError: {error}")
            return
        self.lighthouse.stop()
        self.report()
        outcomes = [records.read_outcome(self.job_dir, g) for g in range(self.layout.count)]
        finish_job(self.job_dir, self.spec, *job_outcome(outcomes, stopped))

    def submit_groups(self, address: str) -> None:
        """Render and sbatch each group's script (RuntimeError with sbatch's words)."""
        for group, hosts in enumerate(self.layout.groups):
            script = self.job_dir.root / group_script_name(group)
            script.write_text(render_group(self.spec, self.job_dir, self.token, self.options,
                                           group, hosts, ft_environment(group, self.ft,
                                                                        address)))
            out = run_slurm("sbatch", "--parsable", str(script))
            self.job_ids.append(out.strip().split(";")[0])
            records.write_job_ids(self.job_dir, self.job_ids)
        self.job_dir.add_transition("Training", f"Submitted {self.layout.count} replica groups "
                                                f"as Slurm jobs {', '.join(self.job_ids)}")

    def watch(self) -> bool:
        """Follow the groups' jobs until none runs; whether the job was stopped."""
        stop_deadline: float | None = None
        while True:
            ended = self.ended_groups()
            if len(ended) == len(self.job_ids):
                return stop_deadline is not None
            if stop_deadline is None and (self.stop.is_set()
                                          or self.job_dir.stop_request_file.exists()):
                grace = self.spec.distribution_config().torch_distributed.stop_grace_seconds
                stop_deadline = time.monotonic() + grace + STOP_MARGIN_SECONDS + 30
                self.cancel("--signal=TERM", "--full")
            elif stop_deadline is not None and time.monotonic() > stop_deadline:
                self.cancel()
            self.end_stragglers(ended)
            self.report()
            time.sleep(POLL_SECONDS)

    def ended_groups(self) -> set[int]:
        ended = set()
        for group, job_id in enumerate(self.job_ids):
            try:
                fields = job_fields(job_id)
            except RuntimeError:
                continue  # Slurm cannot be asked now: ask again
            state = group_ended(fields)
            if state is not None and not self.requeue_lost_run(group, job_id, state, fields):
                ended.add(group)
        return ended

    def requeue_lost_run(self, group: int, job_id: str, state: str,
                         fields: dict[str, str]) -> bool:
        """Requeue a group's job whose batch step died with its node (no outcome recorded)
        and that Slurm did not requeue itself (a node back within SlurmdTimeout fails the job,
        JobLaunchFailure), up to max_restarts times per group; whether it was requeued."""
        if (records.read_outcome(self.job_dir, group) is not None
                or state in ("COMPLETED", "CANCELLED", "TIMEOUT", "UNKNOWN")
                or self.stop.is_set() or self.job_dir.stop_request_file.exists()
                or self.first_done is not None
                or int(fields.get("Restarts", "0") or 0) >= self.budget):
            return False
        try:
            run_slurm("scontrol", "requeue", job_id)
        except RuntimeError:
            return False
        self._log(f"replica group {group}: its Slurm job {job_id} ended {state} without a "
                  "record (its node failed); requeued")
        return True

    def end_stragglers(self, ended: set[int]) -> None:
        """Once a group finished: a waiting (requeued) group is cancelled at once, a running
        one after FINISH_WINDOW_SECONDS (alone, it would find no peer to heal from)."""
        if self.first_done is None:
            if not records.any_group_completed(self.job_dir, self.layout.count):
                return
            self.first_done = time.monotonic()
        late = time.monotonic() - self.first_done > FINISH_WINDOW_SECONDS
        for group, job_id in enumerate(self.job_ids):
            if group in ended or records.read_outcome(self.job_dir, group) is not None:
                continue  # it ended, or its batch step is finishing
            with contextlib.suppress(RuntimeError):
                if late or job_fields(job_id).get("JobState") != "RUNNING":
                    self._log(f"replica group {group}: another group finished; cancelled")
                    run_slurm("scancel", job_id)

    def cancel(self, *flags: str) -> None:
        for job_id in self.job_ids:
            with contextlib.suppress(RuntimeError):
                run_slurm("scancel", *flags, job_id)

    def report(self) -> None:
        """The groups' failures and the figures into status.json, the ft:* line into the log."""
        events = records.read_events(self.job_dir, self.layout.count)
        for group in range(self.layout.count):
            outcome = records.read_outcome(self.job_dir, group) or {}
            if outcome.get("Status") == "Failed":
                events.append({"ReplicaGroup": group, "FailedAt": time.time(), "Lost": True,
                               "FailureReason": (outcome.get("FailureReason") or "")[:1024]})
        status = self.job_dir.read_status()
        known = {(e["ReplicaGroup"], e.get("Lost")): e for e in
                 status.get("FaultToleranceEvents", []) if e.get("Lost")}
        events = [known.get((e["ReplicaGroup"], True), e) if e.get("Lost") else e
                  for e in events]  # a lost group keeps the time it was first seen lost
        summary = fault_tolerance_summary(
            read_step_records(self.job_dir.host_paths(h).output_data_dir
                              for h in self.spec.hosts), events, self.layout.count)
        if (events, summary) != (status.get("FaultToleranceEvents"),
                                 status.get("FaultTolerance")):
            self.job_dir.write_status(FaultToleranceEvents=events, FaultTolerance=summary)
        line = progress_metrics_line(summary)
        if line and line != self._last_line:
            self._log(line, prefix="")
            self._last_line = line

    def _log(self, text: str, prefix: str = LOG_PREFIX) -> None:
        with contextlib.suppress(OSError), open(self.job_dir.log_file, "ab") as log:
            log.write(f"{prefix}{text}\n".encode())


def main(job_dir: JobDirectory) -> None:
    submission = FaultTolerantSubmission(job_dir)
    signal.signal(signal.SIGTERM, lambda *_: submission.stop.set())
    try:
        submission.run()
    finally:
        submission.lighthouse.stop()
