"""A fault-tolerant job on hosts of this machine: one torchrun world per replica group, one torchft
lighthouse, and a failed group restarted alone while the others train on.

The supervisor starts the lighthouse (lighthouse.py) and then every replica group's hosts, each
group with its own rendezvous and told its group and the lighthouse (replica_groups.py). When a
host of a group fails, that group's other hosts get FAILURE_SETTLE_SECONDS to fail on their own
(and record why), then every process of that group (found by the job token and its
MESHTRAIN_FT_REPLICA_GROUP) is ended and the group starts again with a fresh rendezvous; its
ranks heal from a live peer through torchft. The other groups are never touched.

Budget: each group may be restarted ``torch_distributed.max_restarts`` times (per group, not per
job). A group that fails with its budget spent is left out; the others train on.

The end: the job ends once no group is running. As soon as one group has finished (exit 0) no
group is restarted any more (it would find no peer to heal from and start over alone); groups
still running get FINISH_WINDOW_SECONDS to finish too, then they are stopped. The job is
Completed if a group finished, Failed if every group was lost (with the last group's reason).
Every failure is recorded in status.json (``FaultToleranceEvents``) and announced in the log; the
progress display gets ``ft:*`` metric lines (ft_metrics.py). The lighthouse is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meshtrain.backends.hosts.ft_metrics import (
    fault_tolerance_summary,
    progress_metrics_line,
    read_step_records,
)
from meshtrain.backends.hosts.lighthouse import Lighthouse, LighthouseError
from meshtrain.backends.hosts.processes import pids_of_group, signal_groups
from meshtrain.backends.hosts.replica_groups import (
    ReplicaGroups,
    fault_tolerance_of,
    ft_environment,
)
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS, archive_host_records

if TYPE_CHECKING:
    from meshtrain.backends.hosts.supervisor import HostSupervisor

FAILURE_SETTLE_SECONDS = 5.0
GROUP_STOP_SECONDS = 5.0  # a failed group's survivors: SIGTERM, then SIGKILL after this
FINISH_WINDOW_SECONDS = 60.0
REPORT_SECONDS = 2.0  # how often the progress line's ft:* values are refreshed
LOG_PREFIX = "[meshtrain] "


@dataclass
class GroupRun:
    """One replica group's life in the job."""

    index: int
    hosts: tuple[str, ...]
    attempt: int = 1
    state: str = "running"  # running | done | lost | stopped
    readers: list[threading.Thread] = field(default_factory=list)
    reason: str | None = None


class FaultTolerantRun:
    """Runs one fault-tolerant job for `supervisor` (its hosts, logs, stop request, records)."""

    def __init__(self, supervisor: HostSupervisor) -> None:
        self.sup = supervisor
        self.ft = fault_tolerance_of(supervisor.spec)
        assert self.ft is not None  # the supervisor runs this only for a fault-tolerant job
        layout = ReplicaGroups.of(list(supervisor.spec.hosts), self.ft.replica_groups)
        self.groups = [GroupRun(g, hosts) for g, hosts in enumerate(layout.groups)]
        self.budget = supervisor.max_restarts
        self.first_done: float | None = None
        self.lighthouse = Lighthouse(supervisor.job_dir.root / "lighthouse.log",
                                     min_replicas=self.ft.min_replica_groups)
        self._last_report = (0.0, "")

    def run(self, deadline: float) -> tuple[str, str | None]:
        """Start the lighthouse and every group, watch until none runs; (status, reason)."""
        try:
            address = self.lighthouse.start()
        except LighthouseError as error:
            return "Failed", f"ClientError: {error}"
        self.sup.job_dir.write_status(FaultToleranceLayout={
            "ReplicaGroupHosts": [list(g.hosts) for g in self.groups], "Lighthouse": address,
            "LighthousePid": self.lighthouse.pid, "RestartsPerGroup": self.budget})
        self._log(f"fault tolerance: {len(self.groups)} replica groups "
                  f"({'; '.join(', '.join(g.hosts) for g in self.groups)}), lighthouse "
                  f"{address} (pid {self.lighthouse.pid})")
        try:
            for group in self.groups:
                self._start_group(group, address)
            status, reason = self._watch(deadline, address)
        finally:
            grace = self.sup.grace_seconds + STOP_MARGIN_SECONDS
            self.sup.end_hosts(grace if self.sup.stop_requested.is_set() else GROUP_STOP_SECONDS)
            self.lighthouse.stop()
            self._report(force=True)
        return status, reason

    def _start_group(self, group: GroupRun, address: str) -> None:
        env = ft_environment(group.index, self.ft, address)
        for host in group.hosts:
            self.sup.host_extra_env[host] = env
        self.sup.prepare_group(group.index, group.attempt)
        group.readers = [self.sup.start_host(host, group.attempt) for host in group.hosts]
        group.state = "running"

    def _watch(self, deadline: float, address: str) -> tuple[str, str | None]:
        while True:
            if self.sup.stop_requested.is_set():
                from meshtrain.backends.hosts.supervisor import STOPPED_BY_CLIENT
                return "Stopped", STOPPED_BY_CLIENT
            if time.monotonic() > deadline:
                return "Stopped", (f"MaxRuntimeExceeded: the job ran past "
                                   f"max_run={self.sup.spec.max_run}s")
            for group in self._running():
                codes = [self.sup.hosts[h].poll() for h in group.hosts]
                if any(code not in (None, 0) for code in codes):
                    self._on_failure(group, address)
                elif all(code == 0 for code in codes):
                    self._on_done(group)
            self._stop_stragglers()
            if not self._running():
                return self._outcome()
            self._report()
            time.sleep(0.2)

    def _running(self) -> list[GroupRun]:
        return [g for g in self.groups if g.state == "running"]

    def _on_done(self, group: GroupRun) -> None:
        group.state = "done"
        if self.first_done is None:
            self.first_done = time.monotonic()
        self._log(f"replica group {group.index} finished")

    def _on_failure(self, group: GroupRun, address: str) -> None:
        """End the failed group's processes; restart it if its budget allows, else leave it out."""
        failed_at = time.time()
        reason = self._group_reason(group)
        self._end_group(group)
        event: dict[str, Any] = {"ReplicaGroup": group.index, "Attempt": group.attempt,
                                 "FailedAt": failed_at, "FailureReason": reason[:1024]}
        headline = next((line for line in reason.splitlines() if line.strip()), "failed")[:300]
        restarts = group.attempt - 1
        if restarts < self.budget and self.first_done is None and not self.sup.resource_fault:
            archive_host_records(self.sup.job_dir, list(group.hosts), group.attempt)
            group.attempt += 1
            self._start_group(group, address)
            event["RestartedAt"] = time.time()
            self._log(f"replica group {group.index} ({', '.join(group.hosts)}) failed: "
                      f"{headline}; restarting only its hosts (restart {restarts + 1} of "
                      f"{self.budget}); the other groups train on")
        else:
            group.state, group.reason, event["Lost"] = "lost", reason, True
            why = ("another group has finished" if self.first_done is not None
                   else f"its {self.budget} restarts are spent")
            self._log(f"replica group {group.index} failed: {headline}; not restarted ({why}); "
                      "the other groups train on without it")
        events = self.sup.job_dir.read_status().get("FaultToleranceEvents", [])
        self.sup.job_dir.write_status(FaultToleranceEvents=[*events, event])
        self._report(force=True)

    def _group_reason(self, group: GroupRun) -> str:
        """Why the group failed: its hosts' root cause, after they had time to record it."""
        settle = time.monotonic() + FAILURE_SETTLE_SECONDS
        while time.monotonic() < settle and any(
                self.sup.hosts[h].poll() is None for h in group.hosts):
            time.sleep(0.1)
        others = {h: p for h, p in self.sup.hosts.items() if h not in group.hosts}
        self.sup.failed_hosts = [h for h in group.hosts
                                 if self.sup.hosts[h].poll() not in (None, 0)]
        for host in others:  # only this group's records are read
            self.sup.hosts.pop(host)
        try:
            return self.sup.failure_reason() or f"replica group {group.index} failed"
        finally:
            self.sup.hosts.update(others)

    def _end_group(self, group: GroupRun) -> None:
        """SIGTERM the group's hosts, SIGKILL after GROUP_STOP_SECONDS, then every process left
        with the group's mark (ranks live in sessions of their own); reap the hosts."""
        procs = [self.sup.hosts[h] for h in group.hosts]
        signal_groups([p.pid for p in procs if p.poll() is None], signal.SIGTERM)
        deadline = time.monotonic() + GROUP_STOP_SECONDS
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        signal_groups([p.pid for p in procs], signal.SIGKILL)
        for _ in range(5):
            pids = pids_of_group(self.sup.token, group.index)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for proc in procs:
            proc.wait()
        for reader in group.readers:
            reader.join(timeout=5)

    def _stop_stragglers(self) -> None:
        """Groups still running FINISH_WINDOW_SECONDS after the first finished are stopped."""
        if self.first_done is None or time.monotonic() - self.first_done < FINISH_WINDOW_SECONDS:
            return
        for group in self._running():
            self._log(f"replica group {group.index} still runs {FINISH_WINDOW_SECONDS:.0f} s "
                      "after another group finished: stopped")
            self._end_group(group)
            group.state = "stopped"

    def _outcome(self) -> tuple[str, str | None]:
        if any(g.state == "done" for g in self.groups):
            return "Completed", None
        lost = [g for g in self.groups if g.state == "lost"]
        last = lost[-1].reason if lost else None
        return "Failed", (f"every replica group failed; the last: {last}" if last
                          else "every replica group failed")

    def _log(self, text: str) -> None:
        with self.sup.log_lock, contextlib.suppress(OSError), open(
                self.sup.job_dir.log_file, "ab") as log:
            log.write(f"{LOG_PREFIX}{text}\n".encode())

    def _report(self, force: bool = False) -> None:
        """Every REPORT_SECONDS: the figures into status.json (describe() reads them there) and
        the ft:* metric line into the job log, each when it changed."""
        now = time.monotonic()
        if not force and now - self._last_report[0] < REPORT_SECONDS:
            return
        status = self.sup.job_dir.read_status()
        summary = fault_tolerance_summary(
            read_step_records(self.sup.job_dir.host_paths(h).output_data_dir
                              for h in self.sup.spec.hosts),
            status.get("FaultToleranceEvents", []), len(self.groups))
        if summary != status.get("FaultTolerance"):
            self.sup.job_dir.write_status(FaultTolerance=summary)
        line = progress_metrics_line(summary)
        if line and line != self._last_report[1]:
            with self.sup.log_lock, contextlib.suppress(OSError), open(
                    self.sup.job_dir.log_file, "ab") as log:
                log.write(f"{line}\n".encode())
        self._last_report = (now, line or self._last_report[1])
