"""Submits a prepared Slurm job (``python -m meshtrain.backends.slurm.submit JOB_DIR``): the
host backend's detached "supervisor" step. sbatch the job directory's job.sbatch and record
Slurm's job id; the batch step on the cluster does the rest (meshtrain.backends.slurm.batch).
A refused sbatch is recorded as the job's failure with sbatch's own words. A fault-tolerant job
stays here while it runs: ft_submit.py (the lighthouse and one Slurm job per replica group)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.replica_groups import replica_groups_of
from meshtrain.backends.slurm.commands import run_slurm

SCRIPT = "job.sbatch"
JOB_ID_FILE = "slurm_job_id"
BY_HAND = "submit-by-hand"
"""Present when the script was rendered for sbatch by hand (`meshtrain slurm render`)."""


def submit(job_dir: JobDirectory) -> str:
    """sbatch the job's script; Slurm's job id."""
    out = run_slurm("sbatch", "--parsable", str(job_dir.root / SCRIPT))
    slurm_job_id = out.strip().split(";")[0]
    (job_dir.root / JOB_ID_FILE).write_text(slurm_job_id)
    job_dir.add_transition("Pending", f"Submitted to Slurm as job {slurm_job_id}")
    return slurm_job_id


def main() -> None:
    job_dir = JobDirectory(Path(sys.argv[1]))
    if replica_groups_of(job_dir.read_spec()):  # one Slurm job per replica group, and a lighthouse
        from meshtrain.backends.slurm import ft_submit
        ft_submit.main(job_dir)
        return
    if (job_dir.root / BY_HAND).exists():
        job_dir.add_transition("Pending", f"Waiting for `sbatch {job_dir.root / SCRIPT}`")
        return
    try:
        submit(job_dir)
    except (RuntimeError, OSError) as error:
        job_dir.write_status(TrainingJobStatus="Failed", TrainingEndTime=time.time(),
                             FailureReason=f"ClientError: {error}")


if __name__ == "__main__":
    main()
