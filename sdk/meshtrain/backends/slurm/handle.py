"""The handle of a Slurm job: the host layer's (status.json, logs, display) with Slurm's view
of the job where the batch step could not record an outcome (a cancelled or timed-out job),
and stop() as scancel with the grace period. A fault-tolerant job is N Slurm jobs (one per
replica group) followed by its submitting process, which records the job's end: the handle
checks that process as the local handle checks its supervisor, and stop() goes through it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from meshtrain.backends.hosts.job import HostTrainingJob
from meshtrain.backends.hosts.replica_groups import replica_groups_of
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS
from meshtrain.backends.hosts.supervisor import STOPPED_BY_CLIENT
from meshtrain.backends.slurm import groups as records
from meshtrain.backends.slurm.commands import ENDED_STATES, job_fields, run_slurm
from meshtrain.backends.slurm.submit import JOB_ID_FILE
from meshtrain.contract.errors import ConfigError
from meshtrain.job import TERMINAL_STATUSES

POLL_SECONDS = 1.0
HARD_STOP_SECONDS = 30


class SlurmTrainingJob(HostTrainingJob):
    """Handle of a Slurm job (attach() works from any machine that sees the job directory)."""

    @property
    def slurm_job_id(self) -> str | None:
        """Slurm's id of the job (None before sbatch answered)."""
        try:
            return (self.job_dir.root / JOB_ID_FILE).read_text().strip() or None
        except OSError:
            return None

    def slurm_ended(self) -> str | None:
        """Slurm's final state once it runs nothing more of the job (a requeued job is not
        ended), else None."""
        job_id = self.slurm_job_id
        if job_id is None:
            return None
        try:
            fields = job_fields(job_id)
        except RuntimeError:
            return None  # Slurm cannot be asked now: the job is what status.json says
        state = fields.get("JobState", "UNKNOWN")
        if state == "NODE_FAIL" and fields.get("Requeue") == "1":
            return None  # Slurm puts it back in the queue
        return state if state in ENDED_STATES or not fields else None

    @property
    def fault_tolerant(self) -> bool:
        """One Slurm job per replica group (torch_distributed.fault_tolerance)."""
        return bool(replica_groups_of(self.job_dir.read_spec()))

    @property
    def slurm_job_ids(self) -> list[str]:
        """Every Slurm job of this job: the replica groups' in group order, or the one."""
        if self.fault_tolerant:
            return records.read_job_ids(self.job_dir)
        return [self.slurm_job_id] if self.slurm_job_id else []

    def _supervisor_gone(self, checks: int = 3) -> bool:
        """For Slurm: the job ended without the batch step recording an outcome (a
        fault-tolerant job: its submitting process, which records the end, is gone)."""
        if self.fault_tolerant:
            return super()._supervisor_gone(checks)
        return self.slurm_ended() is not None

    def _cancel_groups(self, *flags: str) -> None:
        for job_id in records.read_job_ids(self.job_dir):
            with contextlib.suppress(RuntimeError):
                run_slurm("scancel", *flags, job_id)

    def _record_end_of_dead_supervisor(self) -> dict[str, Any]:
        if self.fault_tolerant:  # its groups and lighthouse must not outlive it
            with contextlib.suppress(ConfigError):  # only its owner ends them
                self.end_leftover_processes()
            if self.job_dir.stop_request_file.exists():
                return self._record_end(TrainingJobStatus="Stopped",
                                        FailureReason=STOPPED_BY_CLIENT)
            return self._record_end(TrainingJobStatus="Failed", FailureReason=(
                "InternalServerError: the submitting process of this fault-tolerant Slurm job "
                "died; its replica groups' jobs were cancelled"))
        state = self.slurm_ended() or "UNKNOWN"
        if self.job_dir.stop_request_file.exists():
            return self._record_end(TrainingJobStatus="Stopped", FailureReason=STOPPED_BY_CLIENT)
        if state == "TIMEOUT":
            spec = self.job_dir.read_spec()
            return self._record_end(TrainingJobStatus="Stopped", FailureReason=(
                f"MaxRuntimeExceeded: the job ran past max_run={spec.max_run}s (Slurm --time)"))
        return self._record_end(TrainingJobStatus="Failed", FailureReason=(
            f"InternalServerError: Slurm job {self.slurm_job_id} ended {state} before meshtrain "
            f"recorded an outcome; see {self.job_dir.root}/slurm-{self.slurm_job_id}.out"))

    def end_leftover_processes(self) -> int:
        self.check_owner("stop")
        if self.fault_tolerant:
            self._cancel_groups()
            return super().end_leftover_processes()  # the lighthouse carries the token
        job_id = self.slurm_job_id
        if job_id is not None and self.slurm_ended() is None:
            with contextlib.suppress(RuntimeError):
                run_slurm("scancel", job_id)
        return 0

    def stop(self) -> None:
        """SIGTERM every step of the job (scancel --signal=TERM --full): the batch step stops
        the ranks with their grace period and records Stopped; after the grace period and a
        margin, scancel ends what is left. The job is terminal when this returns. Only its
        owner may stop it."""
        self.check_owner("stop")
        if self.fault_tolerant:  # its submitting process scancels the groups, records Stopped
            super().stop()
            self._cancel_groups()
            return
        with contextlib.suppress(OSError):
            self.job_dir.stop_request_file.touch()
        job_id = self.slurm_job_id
        grace = self.job_dir.read_spec().distribution_config().torch_distributed
        if job_id is not None and self.slurm_ended() is None:
            with contextlib.suppress(RuntimeError):  # it may end on its own meanwhile
                run_slurm("scancel", "--signal=TERM", "--full", job_id)
            if not self._wait_ended(grace.stop_grace_seconds + STOP_MARGIN_SECONDS + 30):
                with contextlib.suppress(RuntimeError):
                    run_slurm("scancel", job_id)
                self._wait_ended(HARD_STOP_SECONDS)
        if self.job_dir.read_status()["TrainingJobStatus"] not in TERMINAL_STATUSES:
            self._record_end(TrainingJobStatus="Stopped", FailureReason=STOPPED_BY_CLIENT)
            with contextlib.suppress(OSError):
                self.job_dir.add_transition("Stopped", "Training job stopped (scancel)")

    def _wait_ended(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.slurm_ended() is not None:
                return True
            time.sleep(POLL_SECONDS)
        return False
