"""Helpers of the fault-tolerance job tests (tests/e2e and tests/slurm): waiting on a running
job and finding one replica group's rank among its processes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshtrain.backends.hosts.processes import rank_pids_of_job
from meshtrain.contract import env as names

TIMEOUT = 240.0  # a hang, not a speed: the 2-core box may be loaded


def wait_for(what: str, condition: Callable[[], bool], job: Any) -> None:
    """Poll `condition` while `job` is in progress; fail with the job's log otherwise."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        status = job.job_dir.read_status()["TrainingJobStatus"]
        if status != "InProgress" or time.monotonic() > deadline:
            pytest.fail(f"{what}: job {status}\n{job.job_dir.log_file.read_text()[-6000:]}")
        time.sleep(0.2)


def rank_of_group(token: str, group: int, rank: int) -> int | None:
    """The pid of group `group`'s rank `rank`, found among the job's processes."""
    for pid in rank_pids_of_job(token):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (f"{names.MESHTRAIN_FT_REPLICA_GROUP}={group}".encode() in environ
                and f"RANK={rank}".encode() in environ):
            return pid
    return None
