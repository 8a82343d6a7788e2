"""Ending every process of a job: process groups first, then a /proc sweep by job token.

A job's processes are recognised by MESHTRAIN_JOB_TOKEN=<token> in their environment (set when
the supervisor starts and inherited by every host, torchrun agent and rank). The token is unique
per job, so a sweep never reaches another job, even one with the same name elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from meshtrain.contract.env import (
    MESHTRAIN_FT_REPLICA_GROUP,
    MESHTRAIN_JOB_TOKEN,
    RANK_PROCESS_NAME_PREFIX,
)

SWEEP_ROUNDS = 5  # SIGKILL sweeps, for processes a dying parent forked meanwhile


def carries_token(pid: int, token: str, uid: int | None = None) -> bool:
    """True when process `pid` (alive, not a zombie) belongs to the job with this token: it
    carries the token and runs as the job's owner (`uid`, by default this process's user), so
    another user's process that copied a token is never taken for, or signalled as, the job's."""
    if not token or not _runs_as(pid, os.getuid() if uid is None else uid):
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MESHTRAIN_JOB_TOKEN}={token}".encode() in environ.split(b"\0") and _alive(pid)


def _runs_as(pid: int, uid: int) -> bool:
    """Whether process `pid`'s real and effective uids are both `uid`."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("Uid:"):
            real, effective = line.split()[1:3]
            return int(real) == uid and int(effective) == uid
    return False


def pids_of_job(token: str, uid: int | None = None) -> list[int]:
    """Live PIDs (not this process) of the job's owner (`uid`, by default this process's user)
    whose environment carries this job token (Linux /proc)."""
    if not token:
        return []
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid != os.getpid() and carries_token(pid, token, uid):
            found.append(pid)
    return found


def pids_of_group(token: str, group: int) -> list[int]:
    """Live PIDs of the job's replica group `group` (a fault-tolerant job marks every process of
    a group's hosts with MESHTRAIN_FT_REPLICA_GROUP, which they inherit)."""
    mark = f"{MESHTRAIN_FT_REPLICA_GROUP}={group}".encode()
    found = []
    for pid in pids_of_job(token):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


def start_time(pid: int) -> str | None:
    """Process `pid`'s start time (clock ticks after boot, /proc/PID/stat's 22nd field): with
    the PID it names one process, never a later one that reuses the PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def wait_until_gone(pid: int, started: str | None, timeout: float) -> None:
    """Wait (up to `timeout`) until the process `pid` that started at `started` has exited: an
    exiting process loses its environment (so its token) before it is gone."""
    deadline = time.monotonic() + timeout
    while (started is not None and _alive(pid) and start_time(pid) == started
           and time.monotonic() < deadline):
        time.sleep(0.05)


def signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def terminate_groups(pgids: list[int], grace_seconds: float) -> None:
    """SIGTERM each process group, wait up to `grace_seconds`, then SIGKILL what is left."""
    signal_groups(pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pgids):
        time.sleep(0.1)
    signal_groups(pgids, signal.SIGKILL)


RANK_MODULE = b"meshtrain_runtime.host.rank_entry"
AGENT_MODULE = b"meshtrain_runtime.host.agent_entry"
AFTER_RANKS_SECONDS = 5.0  # once the ranks are gone, how long torchrun gets to exit by itself


def rank_number(pid: int) -> int | None:
    """The RANK of process `pid` when it is a rank (every rank names itself ``mt-rank-<RANK>``,
    /proc/PID/comm: a forked one shows its agent's command line and environment), else None."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    number = name.removeprefix(RANK_PROCESS_NAME_PREFIX)
    return int(number) if number != name and number.isdigit() else None


def is_rank(pid: int) -> bool:
    """Whether process `pid` is a rank: it named itself, or, still starting, it runs
    meshtrain_runtime.host.rank_entry."""
    if rank_number(pid) is not None:
        return True
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return RANK_MODULE in parts and AGENT_MODULE not in parts  # the agent names it too


def rank_pids_of_job(token: str) -> list[int]:
    """The job's live rank processes."""
    return [pid for pid in pids_of_job(token) if is_rank(pid)]


def stop_groups_gracefully(pgids: list[int], token: str, grace_seconds: float) -> None:
    """SIGTERM each host's process group and give its ranks up to `grace_seconds` to save and
    exit; SIGKILL the groups then, or AFTER_RANKS_SECONDS after the job's last rank ended
    (a torchrun agent whose peer host is gone may wait in its exit barrier, deaf to SIGTERM)."""
    signal_groups(pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    ranks_ended = None
    while time.monotonic() < deadline and any(_alive(p) for p in pgids):
        if rank_pids_of_job(token):
            ranks_ended = None
        elif ranks_ended is None:
            ranks_ended = time.monotonic()
        elif time.monotonic() - ranks_ended > AFTER_RANKS_SECONDS:
            break
        time.sleep(0.2)
    signal_groups(pgids, signal.SIGKILL)


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_job_processes(token: str, grace_seconds: float = 5.0) -> int:
    """SIGTERM, then SIGKILL, every remaining process carrying this job token (torchrun workers
    live in sessions of their own, so process groups alone do not reach them).

    Returns how many processes were found. Never touches a process without the token.
    """
    pids = pids_of_job(token)
    found = set(pids)
    _signal_pids(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [p for p in pids if _alive(p)]
    for _ in range(SWEEP_ROUNDS):
        pids = pids_of_job(token)
        if not pids:
            break
        found.update(pids)
        _signal_pids(pids, signal.SIGKILL)
        time.sleep(0.1)
    return len(found)
