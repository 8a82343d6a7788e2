"""The shared-filesystem records of a fault-tolerant Slurm job's replica groups.

Each replica group is a Slurm job of its own. Its batch step writes only its own files under
``groups/<g>/`` in the job directory (``outcome.json`` when it ends, ``events.json`` with one
entry per failure it restarted from); the submitting side (ft_submit.py) is the only writer of
status.json's fault-tolerance keys and merges them. ``slurm_job_ids`` holds the groups' Slurm
job ids, one a line, in group order.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from meshtrain.backends.hosts.layout import JobDirectory

JOB_IDS_FILE = "slurm_job_ids"


def group_dir(job_dir: JobDirectory, group: int) -> Path:
    return job_dir.root / "groups" / str(group)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # a reader never sees half a file


def _read_json(path: Path, default: Any) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return default


def write_outcome(job_dir: JobDirectory, group: int, status: str, reason: str | None) -> None:
    """The group's end, as its batch step saw it: Completed, Failed or Stopped."""
    _write_json(group_dir(job_dir, group) / "outcome.json",
                {"Status": status, "FailureReason": reason})


def read_outcome(job_dir: JobDirectory, group: int) -> dict[str, Any] | None:
    return _read_json(group_dir(job_dir, group) / "outcome.json", None)


def add_event(job_dir: JobDirectory, group: int, event: dict[str, Any]) -> None:
    """One failure of the group (FaultToleranceEvents' shape: ReplicaGroup, Attempt, FailedAt,
    RestartedAt, FailureReason)."""
    path = group_dir(job_dir, group) / "events.json"
    _write_json(path, [*_read_json(path, []), {"ReplicaGroup": group, **event}])


def read_events(job_dir: JobDirectory, groups: int) -> list[dict[str, Any]]:
    """Every group's failures, in the order they happened."""
    events: list[dict[str, Any]] = []
    for group in range(groups):
        events += _read_json(group_dir(job_dir, group) / "events.json", [])
    return sorted(events, key=lambda e: float(e.get("FailedAt") or 0))


def any_group_completed(job_dir: JobDirectory, groups: int) -> bool:
    """Once a group has finished no group is restarted (it would find no peer to heal from)."""
    return any((read_outcome(job_dir, g) or {}).get("Status") == "Completed"
               for g in range(groups))


def write_job_ids(job_dir: JobDirectory, job_ids: list[str]) -> None:
    (job_dir.root / JOB_IDS_FILE).write_text("".join(f"{i}\n" for i in job_ids))


def read_job_ids(job_dir: JobDirectory) -> list[str]:
    """The groups' Slurm job ids ([] before the submitting side recorded them)."""
    try:
        return (job_dir.root / JOB_IDS_FILE).read_text().split()
    except OSError:
        return []
