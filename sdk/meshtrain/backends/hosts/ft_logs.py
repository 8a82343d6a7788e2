"""Where torchft's own output goes: a per-group debug file, not the job log.

torchft logs every quorum, commit and checkpoint request at INFO from its Rust core (to the
ranks' stderr), warns on every quorum change that it cannot reset NCCL's flight recorder (on CPU
too), and its checkpoint server logs every request: 88 % of a 600-step job's log once. The
lines that copy a host's output into the job log (hosts/supervisor.py, slurm/node.py) send these
to ``<job dir>/fault_tolerance/torchft-group-<g>.log`` instead (``meshtrain logs JOB --debug``
prints them); torchft's warnings and errors from its core stay in the job log, and the host's
own log keeps every line. What the job log says of fault tolerance is meshtrain's: one line per
failure, restart, heal or change of the groups taking part.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshtrain.backends.hosts.layout import JobDirectory

COORDINATION_FOLDER = "fault_tolerance"
"""``<job dir>/fault_tolerance``: the groups' shared folder (markers, debug logs)."""
_TORCHFT_DEBUG = re.compile(
    rb"\[(?:INFO|DEBUG|TRACE)\] \[torchft::"  # its Rust core (a line torchrun split, too)
    rb"|\] Unable to reset NCCL flight recorder recording"  # every quorum change
    rb'|"GET /checkpoint/\S* HTTP/[\d.]+" \d{3} ')  # its checkpoint server's requests


def is_torchft_debug(line: bytes) -> bool:
    """Whether a line of a rank's output is torchft's debug output (see above)."""
    return _TORCHFT_DEBUG.search(line) is not None


def coordination_dir(job_dir: JobDirectory) -> Path:
    """The folder every rank of the job shares for the groups' markers and debug logs."""
    return job_dir.root / COORDINATION_FOLDER


def debug_log(job_dir: JobDirectory, group: int | str) -> Path:
    """Replica group `group`'s torchft debug file."""
    return coordination_dir(job_dir) / f"torchft-group-{group}.log"


def debug_logs(job_dir: JobDirectory) -> list[Path]:
    """Every group's debug file, in group order."""
    found = coordination_dir(job_dir).glob("torchft-group-*.log")
    return sorted(found, key=lambda p: int(p.stem.rpartition("-")[2] or 0))


__all__ = ["COORDINATION_FOLDER", "coordination_dir", "debug_log", "debug_logs",
           "is_torchft_debug"]
