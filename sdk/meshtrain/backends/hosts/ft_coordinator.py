"""The replica-group policy of a fault-tolerant job, written once: local processes (ft_run.py) and
Slurm (slurm/ft_submit.py, whose groups' batch steps restart through slurm/ft_group.py) follow it.

- **Grouping**: `ReplicaGroups` (replica_groups.py); each group a torchrun world of its own.
- **Budget**: ``torch_distributed.max_restarts`` restarts per group (the contract gives a
  fault-tolerant job ``DEFAULT_REPLICA_GROUP_RESTARTS`` when it does not say), never after a stop
  and never once a group has finished (a group restarted then would find no peer to heal from).
- **The end**: a group finishes when its hosts exit 0 and it did not stop itself (the runtime
  stops a group whose loop is behind once another group finished; it writes a `SUPERSEDED`
  marker). When the first group finishes, the job ends: a group that has not committed the
  job's last step (the finished group's) is stopped at once, a group that has gets
  FINISH_WINDOW_SECONDS to exit by itself. The model artifacts are the finished group's.
- **Outcome**: Completed when a group finished; Stopped on a stop; Failed when every group was
  lost, with the last group's reason.
- **One log line per event** (failure, restart, loss, finish, stop), prefixed ``[meshtrain]``;
  the ranks say when a group heals or the groups taking part change (meshtrain_runtime.fault).
- **The figures**: status.json's ``FaultTolerance`` (describe()) and the progress line's ft:*
  values, from the groups' step records and the failures (ft_metrics.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from meshtrain.backends.hosts.ft_logs import coordination_dir
from meshtrain.backends.hosts.ft_metrics import (
    fault_tolerance_summary,
    progress_metrics_line,
    read_checkpoint_records,
    read_step_records,
)
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.replica_groups import ReplicaGroups, fault_tolerance_of
from meshtrain.backends.hosts.restarts import LOG_PREFIX, STOPPED_BY_CLIENT
from meshtrain.contract.fault_tolerance import FINISHED, SUPERSEDED, read_markers
from meshtrain.contract.jobspec import JobSpec

FINISH_WINDOW_SECONDS = 60.0
"""How long a group that has committed the job's last step gets to exit by itself."""

RUNNING, DONE, LOST, STOPPED = "running", "done", "lost", "stopped"


def may_restart(restarts_done: int, budget: int, *, peer_finished: bool,
                stopping: bool = False) -> bool:
    """Whether a group that failed after `restarts_done` restarts is started again."""
    return restarts_done < budget and not peer_finished and not stopping


def headline(reason: str) -> str:
    """The first line of a failure reason, for a one-line event."""
    return next((line.strip() for line in reason.splitlines() if line.strip()), "failed")[:300]


def restart_line(group: int, hosts: Iterable[str], reason: str, restart: int,
                 budget: int) -> str:
    return (f"replica group {group} ({', '.join(hosts)}) failed: {headline(reason)}; "
            f"restarting only its hosts (restart {restart} of {budget}); the other groups "
            "train on")


def lost_line(group: int, reason: str, why: str) -> str:
    return (f"replica group {group} failed: {headline(reason)}; not restarted ({why}); the "
            "other groups train on without it")


@dataclass
class GroupRun:
    """One replica group's life in the job."""

    index: int
    hosts: tuple[str, ...]
    attempt: int = 1
    state: str = RUNNING  # running | done | lost | stopped
    reason: str | None = None
    readers: list[threading.Thread] = field(default_factory=list)


class ReplicaGroupCoordinator:
    """The decisions and records of one fault-tolerant job; a backend starts and ends groups."""

    def __init__(self, spec: JobSpec, job_dir: JobDirectory, *,
                 log_lock: threading.Lock | None = None) -> None:
        ft = fault_tolerance_of(spec)
        assert ft is not None  # backends use this only for a fault-tolerant job
        self.spec, self.job_dir, self.ft = spec, job_dir, ft
        self.layout = ReplicaGroups.of(list(spec.hosts), ft.replica_groups)
        self.groups = [GroupRun(g, hosts) for g, hosts in enumerate(self.layout.groups)]
        self.budget = spec.distribution_config().torch_distributed.max_restarts
        self.log_lock = log_lock or threading.Lock()
        self.first_done: GroupRun | None = None
        self.first_done_at: float | None = None
        self._last_line = ""

    # --- decisions ---
    def running(self) -> list[GroupRun]:
        return [g for g in self.groups if g.state == RUNNING]

    def may_restart(self, group: GroupRun, *, stopping: bool = False) -> bool:
        return may_restart(group.attempt - 1, self.budget,
                           peer_finished=self.first_done is not None, stopping=stopping)

    def on_failure(self, group: GroupRun, reason: str, failed_at: float, *,
                   restarted: bool) -> dict[str, Any]:
        """Record a failure of `group` (restarted, or lost); its FaultToleranceEvents entry."""
        event: dict[str, Any] = {"ReplicaGroup": group.index, "Attempt": group.attempt,
                                 "FailedAt": failed_at, "FailureReason": reason[:1024]}
        if restarted:
            self.log(restart_line(group.index, group.hosts, reason, group.attempt, self.budget))
            group.attempt += 1
            event["RestartedAt"] = time.time()
        else:
            why = ("another group has finished" if self.first_done is not None
                   else f"its {self.budget} restarts are spent")
            group.state, group.reason, event["Lost"] = LOST, reason, True
            self.log(lost_line(group.index, reason, why))
        return event

    def on_exit_zero(self, group: GroupRun) -> None:
        """`group`'s hosts all exited 0: it finished, or it stopped itself for a finished peer."""
        superseded = read_markers(coordination_dir(self.job_dir), SUPERSEDED).get(group.index)
        if superseded is not None and superseded.get("attempt") in (None, group.attempt):
            group.state = STOPPED
            self.log(f"replica group {group.index} stopped: replica group "
                     f"{superseded.get('finished_group')} finished the job first")
            return
        group.state = DONE
        if self.first_done is None:
            self.first_done, self.first_done_at = group, time.monotonic()
        self.log(f"replica group {group.index} finished")

    def to_stop(self, now: float | None = None) -> list[GroupRun]:
        """Once a group finished: groups still running that have not committed the job's last
        step (at once), and the others once FINISH_WINDOW_SECONDS have passed."""
        if self.first_done is None or self.first_done_at is None:
            return []
        late = (now or time.monotonic()) - self.first_done_at >= FINISH_WINDOW_SECONDS
        committed = self.committed_steps()
        last = committed.get(self.first_done.index, 0)
        chosen = []
        for group in self.running():
            behind = committed.get(group.index, 0) < last
            if behind or late:
                why = (f"it had committed {committed.get(group.index, 0)} of the job's {last} "
                       "steps" if behind else
                       f"it still ran {FINISH_WINDOW_SECONDS:.0f} s after")
                self.log(f"replica group {group.index} stopped: replica group "
                         f"{self.first_done.index} finished the job ({why})")
                chosen.append(group)
        return chosen

    def committed_steps(self) -> dict[int, int]:
        """Steps each group committed: its finish marker's count, else from its step records."""
        counts: dict[int, int] = {}
        for record in self.step_records():
            if record.get("committed"):
                group = int(record["replica_group"])
                counts[group] = max(counts.get(group, 0), int(record["step"]) + 1)
        for group, marker in read_markers(coordination_dir(self.job_dir), FINISHED).items():
            counts[group] = max(counts.get(group, 0), int(marker.get("committed_steps") or 0))
        return counts

    def outcome(self, stopped: str | None = None) -> tuple[str, str | None]:
        """(status, reason) once no group runs; `stopped` is the reason of a stop, if any."""
        if self.first_done is not None:
            return "Completed", None
        if stopped:
            return "Stopped", stopped
        halted = [g for g in self.groups if g.state == STOPPED and g.reason]
        if halted:  # its own end stopped a group (max_run on Slurm, an scancel)
            return "Stopped", "; ".join(f"replica group {g.index}: {g.reason}" for g in halted)
        lost = [g for g in self.groups if g.state == LOST]
        last = lost[-1].reason if lost else None
        return "Failed", (f"every replica group failed; the last: {last}" if last
                          else "every replica group failed")

    def model_hosts(self) -> list[str] | None:
        """Whose /opt/ml/model the job's model.tar.gz packs: the first finished group's."""
        return list(self.first_done.hosts) if self.first_done is not None else None

    # --- records ---
    def layout_status(self, lighthouse: str, lighthouse_pid: int | None) -> dict[str, Any]:
        return {"ReplicaGroupHosts": [list(g.hosts) for g in self.groups],
                "Lighthouse": lighthouse, "LighthousePid": lighthouse_pid,
                "RestartsPerGroup": self.budget}

    def step_records(self) -> list[dict[str, Any]]:
        return read_step_records(self.job_dir.host_paths(h).output_data_dir
                                 for h in self.spec.hosts)

    def report(self, events: list[dict[str, Any]]) -> None:
        """The figures into status.json (describe() reads them) and the ft:* progress line into
        the job log, each when it changed."""
        summary = fault_tolerance_summary(
            self.step_records(), events, len(self.groups),
            read_checkpoint_records(self.job_dir.host_paths(h).output_data_dir
                                    for h in self.spec.hosts))
        if self.first_done is not None:
            summary["FinishedReplicaGroup"] = self.first_done.index
            summary["ModelArtifactsFrom"] = list(self.first_done.hosts)
        status = self.job_dir.read_status()
        if (events, summary) != (status.get("FaultToleranceEvents", []),
                                 status.get("FaultTolerance")):
            self.job_dir.write_status(FaultToleranceEvents=events, FaultTolerance=summary)
        line = progress_metrics_line(summary)
        if line and line != self._last_line:
            self.write(line)
            self._last_line = line

    def log(self, text: str) -> None:
        """One event line in the job log."""
        self.write(f"{LOG_PREFIX}{text}")

    def write(self, line: str) -> None:
        with self.log_lock, contextlib.suppress(OSError), open(
                self.job_dir.log_file, "ab") as log:
            log.write(f"{line}\n".encode())


def stop_reason(stop_requested: Callable[[], bool], deadline: float, max_run: int
                ) -> str | None:
    """Why a running job must stop now (a stop request, max_run), or None."""
    if stop_requested():
        return STOPPED_BY_CLIENT
    if time.monotonic() > deadline:
        return f"MaxRuntimeExceeded: the job ran past max_run={max_run}s"
    return None


__all__ = ["FINISH_WINDOW_SECONDS", "GroupRun", "ReplicaGroupCoordinator", "coordination_dir",
           "headline", "lost_line", "may_restart", "restart_line", "stop_reason"]
