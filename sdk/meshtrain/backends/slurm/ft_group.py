"""The batch step of one replica group of a fault-tolerant Slurm job (batch.py with a GROUP):
its hosts, its restarts and its outcome, recorded in the group's own files (groups.py).

A failed attempt restarts only the group's hosts (the other groups' Slurm jobs are never
touched); a run of the group's job that Slurm requeued (one of its nodes died) is recorded as a
failure the same way, FailedAt being the time of the group's last step record.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from meshtrain.backends.hosts.ft_coordinator import may_restart, restart_line
from meshtrain.backends.hosts.ft_metrics import read_step_records
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.replica_groups import ReplicaGroups, replica_groups_of
from meshtrain.backends.hosts.restarts import LOG_PREFIX, archive_host_records
from meshtrain.backends.slurm import groups as records
from meshtrain.contract.jobspec import JobSpec


@dataclass(frozen=True)
class GroupRecords:
    """Replica group `index` of the job in `job_dir`."""

    job_dir: JobDirectory
    spec: JobSpec
    index: int
    hosts: tuple[str, ...]
    count: int

    @classmethod
    def of(cls, job_dir: JobDirectory, spec: JobSpec, group: int) -> GroupRecords:
        count = replica_groups_of(spec) or 1
        return cls(job_dir, spec, group, ReplicaGroups.of(list(spec.hosts), count).groups[group],
                   count)

    def log(self, text: str) -> None:
        with contextlib.suppress(OSError), open(self.job_dir.log_file, "ab") as log:
            log.write(f"{LOG_PREFIX}{text}\n".encode())

    def begin(self) -> float:
        """A requeued run (SLURM_RESTART_COUNT > 0) is recorded as the group's failure; the
        deadline is the job's (the submitting side wrote TrainingStartTime)."""
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        if restarts:
            archive_host_records(self.job_dir, list(self.hosts), 1000 + restarts)
            own = [r for r in read_step_records(self.job_dir.host_paths(h).output_data_dir
                                                for h in self.hosts)
                   if int(r["replica_group"]) == self.index]
            failed_at = max((float(r["time"]) for r in own), default=time.time())
            records.add_event(self.job_dir, self.index, {
                "Attempt": 1000 + restarts, "FailedAt": failed_at, "RestartedAt": time.time(),
                "FailureReason": f"Slurm requeued the group's job {os.environ.get('SLURM_JOB_ID')}"
                                 " (a node of it failed)"})
            self.log(f"replica group {self.index} ({', '.join(self.hosts)}) requeued by Slurm "
                     f"(run {restarts + 1}); the other groups train on")
        status = self.job_dir.read_status()
        return float(status.get("TrainingStartTime") or time.time()) + self.spec.max_run

    def may_restart(self, attempt: int, *, stopping: bool) -> bool:
        """The coordinator's rule, for failed `attempt` of this group."""
        budget = self.spec.distribution_config().torch_distributed.max_restarts
        return may_restart(attempt - 1, budget, stopping=stopping,
                           peer_finished=records.any_group_completed(self.job_dir, self.count))

    def restart(self, attempt: int, reason: str, failed_at: float) -> None:
        """Record failed `attempt` of this group (its srun ended at `failed_at`) and clear its
        hosts' records."""
        records.add_event(self.job_dir, self.index, {
            "Attempt": attempt, "FailedAt": failed_at, "RestartedAt": time.time(),
            "FailureReason": reason[:1024]})
        budget = self.spec.distribution_config().torch_distributed.max_restarts
        self.log(restart_line(self.index, self.hosts, reason, attempt, budget))
        archive_host_records(self.job_dir, list(self.hosts), attempt)

    def finish(self, status: str, reason: str | None) -> None:
        """The group's end, for the submitting side (which says it in the log, once)."""
        records.write_outcome(self.job_dir, self.index, status, reason)
