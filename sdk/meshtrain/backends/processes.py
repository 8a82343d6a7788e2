"""Ending every process of a job: process groups first, then a /proc sweep by job marker."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from meshtrain.contract.env import MESHTRAIN_JOB_NAME


def pids_of_job(job_name: str) -> list[int]:
    """PIDs whose environment carries MESHTRAIN_JOB_NAME=<job_name> (Linux /proc; else [])."""
    marker = f"{MESHTRAIN_JOB_NAME}={job_name}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and int(entry.name) != os.getpid():
            found.append(int(entry.name))
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


def kill_job_processes(job_name: str, grace_seconds: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every remaining process marked with this job (torchrun workers
    live in sessions of their own, so process groups alone do not reach them)."""
    pids = pids_of_job(job_name)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    for pid in pids_of_job(job_name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
