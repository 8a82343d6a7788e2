"""Between two attempts of a local job: record why the attempt failed, clear the hosts' records.

With ``torch_distributed.max_restarts=N`` the supervisor restarts every host of a failed job
together, up to N times: a fresh rendezvous, the same job directory and the same /opt/ml trees
(so the script resumes from ``latest_checkpoint()`` in the job's checkpoint folder). Each failed
attempt is kept in status.json (``FailedAttempts``, shown by describe()) and announced in the job
log, which fit() prints. The hosts' failure records of the attempt are moved aside
(``hosts/<host>/attempts/<n>/``) so the next attempt starts clean and a later failure is blamed
on what happened in its own attempt.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterable

from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.contract.jobspec import JobSpec

__all__ = ["LOG_PREFIX", "STOPPED_BY_CLIENT", "STOP_MARGIN_SECONDS", "archive_host_records",
           "attempt_line", "restart_after_failure"]

STOP_MARGIN_SECONDS = 15.0
"""Past the grace period, how long torchrun gets to SIGKILL its ranks and exit on its own."""
LOG_PREFIX = "[meshtrain] "
"""What starts every line the supervisors (not the hosts) write into the job log."""
STOPPED_BY_CLIENT = ("StopRequested: the job was stopped by its client (stop(), Ctrl-C in fit() "
                     "or `meshtrain stop`)")


def attempt_line(attempt: int, total: int, reason: str) -> str:
    """The one line fit() shows for a failed attempt."""
    headline = next((line.strip() for line in reason.splitlines() if line.strip()), "failed")
    return (f"{LOG_PREFIX}attempt {attempt} of {total} failed: {headline[:300]}; restarting "
            "every host")


def archive_host_records(job_dir: JobDirectory, hosts: Iterable[str], attempt: int) -> None:
    """Move each host's failure file and work folder (rank records, torchrun logs) aside."""
    for host in hosts:
        paths = job_dir.host_paths(host)
        kept = job_dir.root / "hosts" / host / "attempts" / str(attempt)
        kept.mkdir(parents=True, exist_ok=True)
        work = job_dir.host_work_dir(host)
        if work.exists():
            shutil.move(str(work), str(kept / "work"))
        if paths.failure_file.exists():
            shutil.move(str(paths.failure_file), str(kept / "failure"))
        paths.success_file.unlink(missing_ok=True)


def restart_after_failure(job_dir: JobDirectory, spec: JobSpec, attempt: int, reason: str,
                          log_lock: threading.Lock) -> None:
    """Record failed `attempt` (status.json, job log, a transition) and clear the hosts."""
    total = spec.distribution_config().torch_distributed.max_restarts + 1
    failed = job_dir.read_status().get("FailedAttempts", [])
    failed.append({"Attempt": attempt, "EndTime": time.time(), "FailureReason": reason})
    job_dir.write_status(FailedAttempts=failed)
    line = attempt_line(attempt, total, reason)
    with log_lock, contextlib.suppress(OSError), open(job_dir.log_file, "ab") as log:
        log.write((line + "\n").encode())
    job_dir.add_transition("Restarting", f"Attempt {attempt} failed; restarting every host "
                                         f"(attempt {attempt + 1} of {total})")
    archive_host_records(job_dir, spec.hosts, attempt)
