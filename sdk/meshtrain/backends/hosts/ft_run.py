"""A fault-tolerant job on hosts of this machine: one torchrun world per replica group, one torchft
lighthouse, and a failed group restarted alone while the others train on.

The supervisor starts the lighthouse (lighthouse.py) and then every replica group's hosts, each
group with its own rendezvous and told its group, the lighthouse and the job's coordination
folder (replica_groups.py). When a host of a group fails, that group's other hosts get
FAILURE_SETTLE_SECONDS to fail on their own (and record why), then every process of that group
(found by the job token and its MESHTRAIN_FT_REPLICA_GROUP) is ended and, if the policy allows
it, the group starts again with a fresh rendezvous; its ranks heal from a live peer through
torchft. The other groups are never touched. What is decided (budget, the end, the outcome, the
lines) is the coordinator's (ft_coordinator.py), which Slurm follows too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Protocol

from meshtrain.backends.hosts.ft_coordinator import (
    GroupRun,
    ReplicaGroupCoordinator,
    coordination_dir,
    stop_reason,
)
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.lighthouse import Lighthouse, LighthouseError
from meshtrain.backends.hosts.processes import pids_of_group, signal_groups
from meshtrain.backends.hosts.replica_groups import ft_environment
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS, archive_host_records
from meshtrain.contract.jobspec import JobSpec

FAILURE_SETTLE_SECONDS = 5.0
GROUP_STOP_SECONDS = 5.0  # a failed group's survivors: SIGTERM, then SIGKILL after this
REPORT_SECONDS = 2.0  # how often the progress line's ft:* values are refreshed
POLL_SECONDS = 0.2


class GroupHosts(Protocol):
    """What a fault-tolerant run needs of the job's supervisor (hosts/supervisor.py)."""

    job_dir: JobDirectory
    spec: JobSpec
    token: str
    hosts: dict[str, subprocess.Popen]
    host_extra_env: dict[str, dict[str, str]]
    failed_hosts: list[str]
    resource_fault: str | None
    stop_requested: threading.Event
    log_lock: threading.Lock
    grace_seconds: float

    def prepare_group(self, group: int, attempt: int) -> None: ...
    def start_host(self, host: str, attempt: int) -> threading.Thread: ...
    def end_hosts(self, grace_seconds: float) -> None: ...
    def failure_reason(self) -> str: ...


class FaultTolerantRun:
    """Runs one fault-tolerant job for `supervisor` (its hosts, logs, stop request, records)."""

    def __init__(self, supervisor: GroupHosts) -> None:
        self.sup = supervisor
        self.policy = ReplicaGroupCoordinator(supervisor.spec, supervisor.job_dir,
                                              log_lock=supervisor.log_lock)
        self.groups = self.policy.groups
        self.lighthouse = Lighthouse(supervisor.job_dir.root / "lighthouse.log",
                                     fault_tolerance=self.policy.ft)
        self._last_report = 0.0

    def run(self, deadline: float) -> tuple[str, str | None]:
        """Start the lighthouse and every group, watch until none runs; (status, reason)."""
        try:
            address = self.lighthouse.start()
        except LighthouseError as error:
            return "Failed", f"ClientError: {error}"
        self.sup.job_dir.write_status(FaultToleranceLayout=self.policy.layout_status(
            address, self.lighthouse.pid))
        self.policy.log(f"fault tolerance: {len(self.groups)} replica groups "
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

    def model_hosts(self) -> list[str] | None:
        """The hosts whose model artifacts the job keeps (the finished group's)."""
        return self.policy.model_hosts()

    def _start_group(self, group: GroupRun, address: str) -> None:
        env = ft_environment(group.index, self.policy.ft, address,
                             coordination_dir(self.sup.job_dir))
        for host in group.hosts:
            self.sup.host_extra_env[host] = env
        self.sup.prepare_group(group.index, group.attempt)
        group.readers = [self.sup.start_host(host, group.attempt) for host in group.hosts]

    def _watch(self, deadline: float, address: str) -> tuple[str, str | None]:
        while True:
            stopped = stop_reason(self.sup.stop_requested.is_set, deadline, self.sup.spec.max_run)
            if stopped:
                return "Stopped", stopped
            for group in self.policy.running():
                codes = [self.sup.hosts[h].poll() for h in group.hosts]
                if any(code not in (None, 0) for code in codes):
                    self._on_failure(group, address)
                elif all(code == 0 for code in codes):
                    self.policy.on_exit_zero(group)
            for group in self.policy.to_stop():
                self._end_group(group)
                group.state = "stopped"
            if not self.policy.running():
                return self.policy.outcome()
            self._report()
            time.sleep(POLL_SECONDS)

    def _on_failure(self, group: GroupRun, address: str) -> None:
        """End the failed group's processes; restart it if the policy allows, else leave it."""
        failed_at = time.time()
        reason = self._group_reason(group)
        self._end_group(group)
        restart = (self.policy.may_restart(group, stopping=self.sup.stop_requested.is_set())
                   and not self.sup.resource_fault)
        if restart:
            archive_host_records(self.sup.job_dir, list(group.hosts), group.attempt)
        event = self.policy.on_failure(group, reason, failed_at, restarted=restart)
        if restart:
            self._start_group(group, address)
            event["RestartedAt"] = time.time()
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

    def _report(self, force: bool = False) -> None:
        """Every REPORT_SECONDS (or now): the figures and the ft:* line (the coordinator's)."""
        now = time.monotonic()
        if not force and now - self._last_report < REPORT_SECONDS:
            return
        self.policy.report(self.sup.job_dir.read_status().get("FaultToleranceEvents", []))
        self._last_report = now
