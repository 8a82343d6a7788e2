"""The handle of a job whose hosts run on this machine: every method reads its job directory,
so attach() works from any process."""

from __future__ import annotations

import codecs
import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from meshtrain.backends.hosts.artifacts import output_location
from meshtrain.backends.hosts.ft_logs import debug_logs
from meshtrain.backends.hosts.ft_metrics import fault_tolerance_summary, read_step_records
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.processes import (
    carries_token,
    kill_job_processes,
    pids_of_job,
    start_time,
    wait_until_gone,
)
from meshtrain.backends.hosts.replica_groups import replica_groups_of
from meshtrain.backends.hosts.restarts import STOP_MARGIN_SECONDS
from meshtrain.backends.hosts.s3_staging import read_destinations
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.private_files import check_owned, owner_uid
from meshtrain.display import JobDisplay, host_index, make_display
from meshtrain.job import TERMINAL_STATUSES, TrainingJob, reported_interrupt, say_on_stderr
from meshtrain.job_layout import layout_of_spec
from meshtrain.pipes import drop_output_to_closed_pipes
from meshtrain.progress import total_steps_from

POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0


class HostTrainingJob(TrainingJob):
    """Handle of a job under a jobs_dir; every method reads the job directory."""

    def __init__(self, job_name: str, job_dir: JobDirectory) -> None:
        super().__init__(job_name)
        self.job_dir = job_dir
        self._log_offset = 0
        self._layout: dict[str, Any] | None = None

    @property
    def token(self) -> str:
        """The token every process of this job carries (MESHTRAIN_JOB_TOKEN)."""
        return self.job_dir.read_token()

    def log_location(self) -> str:
        return str(self.job_dir.log_file)

    def stop_hint(self) -> str:
        return f"Ctrl-C or meshtrain stop {self.job_name}"

    @property
    def owner_uid(self) -> int:
        """The job's owner: the user who made its directory (and runs its processes)."""
        return owner_uid(self.job_dir.root)

    def check_owner(self, action: str) -> None:
        """ConfigError unless this process's user owns the job (stop, rm)."""
        check_owned(self.job_dir.root, f"job {self.job_name}", action)

    def end_leftover_processes(self) -> int:
        """A job whose supervisor was killed may leave processes without a lifeline (a script's
        detached children): end every one still carrying the job's token (its owner only)."""
        self.check_owner("stop")
        return kill_job_processes(self.token, grace_seconds=STOP_GRACE_SECONDS)

    def processes(self) -> list[int]:
        """PIDs of this job's processes still running (supervisor, hosts, agents, ranks)."""
        return pids_of_job(self.token, self.owner_uid)

    def _supervisor_pid(self) -> int | None:
        """The supervisor's PID while it runs: a PID is only trusted if the process carries
        this job's token (a recycled PID belongs to someone else)."""
        try:
            pid = int(self.job_dir.supervisor_pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if carries_token(pid, self.token, self.owner_uid) else None

    def _sees_processes(self) -> bool:
        """Whether this user can see the job's processes (their environment is readable only
        by their owner and root): another user never records a live job as dead."""
        return os.getuid() in (0, self.owner_uid)

    def _supervisor_alive(self) -> bool:
        return self._supervisor_pid() is not None

    def _supervisor_gone(self, checks: int = 3) -> bool:
        """Not alive at `checks` looks POLL_SECONDS apart: between fork and exec a just-started
        supervisor still has its parent's environment (no token) and looks like a stranger."""
        for check in range(checks):
            if self._supervisor_alive():
                return False
            if check < checks - 1:
                time.sleep(POLL_SECONDS)
        return True

    def _record_end(self, **changes: Any) -> dict[str, Any]:
        """Record a terminal status the supervisor could not (never raises on a full disk)."""
        try:
            return self.job_dir.write_status(TrainingEndTime=time.time(), **changes)
        except OSError:
            return {**self.job_dir.read_status(), **changes}

    def _record_end_of_dead_supervisor(self) -> dict[str, Any]:
        if self.job_dir.stop_request_file.exists():
            return self._record_end(TrainingJobStatus="Stopped")
        return self._record_end(
            TrainingJobStatus="Failed",
            FailureReason="InternalServerError: the local supervisor process died")

    def describe(self) -> dict[str, Any]:
        status = self.job_dir.read_status()
        if (status["TrainingJobStatus"] not in TERMINAL_STATUSES and self._sees_processes()
                and self._supervisor_gone()):
            status = self.job_dir.read_status()  # it may have finished between the two reads
            if status["TrainingJobStatus"] not in TERMINAL_STATUSES:
                status = self._record_end_of_dead_supervisor()
        spec = self.job_dir.read_spec()
        return {**_description(spec, self.job_dir, status), "Layout": self.layout(spec)}

    def layout(self, spec: JobSpec | None = None) -> dict[str, Any]:
        """describe()["Layout"] (meshtrain.job_layout), worked out once per handle."""
        if self._layout is None:
            self._layout = layout_of_spec(spec or self.job_dir.read_spec())
        return self._layout

    def summary(self) -> dict[str, Any]:
        """What a listing shows: the status file (checked like describe() while running) and
        the layout."""
        status = self.job_dir.read_status()
        if status.get("TrainingJobStatus") not in TERMINAL_STATUSES:
            status = self.describe()
        return {"TrainingJobName": self.job_name, **status, "Layout": self.layout()}

    def _show_new_log(self, display: JobDisplay) -> None:
        with open(self.job_dir.log_file, "rb") as log:
            log.seek(self._log_offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._log_offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            display.log(line, host=host_index(line))

    def wait(self, logs: bool = True) -> None:
        # A `| head` or `| tee` that has gone must neither end the wait nor the Ctrl-C handler
        # before its stop: its writes are dropped (fit() wraps this too; scripts call wait()).
        with drop_output_to_closed_pipes():
            self._wait(logs)

    def _wait(self, logs: bool) -> None:
        display = make_display(self.job_name, total_steps=total_steps_from(
            self.job_dir.read_spec().hyperparameters), header=self.start_line()) if logs else None
        try:
            description = self._follow(display)
        except KeyboardInterrupt:
            if display is not None:
                display.close()
            outcome = self._stop_on_interrupt()
            # The caller's program stops too, as Ctrl-C means (docs/local-jobs.md), with the
            # one line just printed instead of the frames of a polling loop the user never wrote.
            raise reported_interrupt(f"training job {self.job_name} was {outcome} (Ctrl-C)",
                                     say=False) from None
        self._wait_for_supervisor_exit()  # it records the status just before it ends
        if display is not None:
            self._show_new_log(display)
            display.close()
            print(f"===== Job {description['TrainingJobStatus']} =====")
        self.raise_for_status(description)

    def _follow(self, display: JobDisplay | None) -> dict[str, Any]:
        """Poll until the job is terminal, showing its new log lines and status meanwhile."""
        while True:
            description = self.describe()
            if display is not None:
                self._show_new_log(display)
                display.status(description["TrainingJobStatus"])
            if description["TrainingJobStatus"] in TERMINAL_STATUSES:
                return description
            time.sleep(POLL_SECONDS)

    def _stop_on_interrupt(self) -> str:
        """Ctrl-C while waiting: a local job dies with its client, and says so in one line on
        stderr (stdout may be a `| tee` the same Ctrl-C ended); returns how it ended."""
        after_echo = "\n" if _is_terminal(sys.stderr) else ""  # the terminal's "^C"
        say_on_stderr(f"{after_echo}meshtrain: Ctrl-C: stopping job {self.job_name} ... ")
        try:
            self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: leave the supervisor to finish it
            say_on_stderr(f"still stopping in the background (meshtrain status "
                          f"{self.job_name}).\n")
            return "left stopping"
        outcome = self.job_dir.read_status().get("TrainingJobStatus", "?").lower()
        say_on_stderr(f"{outcome}; its log: meshtrain logs {self.job_name}\n")
        return outcome

    def logs(self) -> None:
        """Print the job's merged log so far (every host, prefixed with its name)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(self.job_dir.log_file, "rb") as log:
            for chunk in iter(lambda: log.read(1 << 20), b""):  # large logs: not all in memory
                sys.stdout.write(decoder.decode(chunk))
        sys.stdout.write(decoder.decode(b"", final=True))
        sys.stdout.flush()

    def log_lines(self) -> Iterator[str]:
        """The merged log, streamed from disk line by line."""
        with open(self.job_dir.log_file, encoding="utf-8", errors="replace") as log:
            for line in log:
                yield line.rstrip("\n")

    def debug_log_lines(self) -> Iterator[str]:
        """torchft's output of each replica group (hosts/ft_logs.py), group after group."""
        for path in debug_logs(self.job_dir):
            with open(path, encoding="utf-8", errors="replace") as log:
                for line in log:
                    yield line.rstrip("\n")

    def stop(self) -> None:
        """SIGTERM the supervisor, which ends every host and records the status. If it is gone
        (killed) or does not end, every process still carrying the job's token is ended here
        and the job is recorded as Stopped: the job is terminal when this returns. Only the
        job's owner may stop it (ConfigError for anyone else, before anything is touched)."""
        self.check_owner("stop")
        pid = self._supervisor_pid()
        with contextlib.suppress(OSError):  # a full disk must not keep the job from stopping
            self.job_dir.stop_request_file.touch()
        if pid is not None:
            started = start_time(pid)
            with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
                os.kill(pid, signal.SIGTERM)
            # the ranks' grace period (torch_distributed.stop_grace_seconds), then packing
            grace = self.job_dir.read_spec().distribution_config().torch_distributed
            self._wait_for_supervisor_exit(grace.stop_grace_seconds + STOP_MARGIN_SECONDS + 60)
            wait_until_gone(pid, started, timeout=STOP_GRACE_SECONDS)
        kill_job_processes(self.token, grace_seconds=STOP_GRACE_SECONDS)
        if self.job_dir.read_status()["TrainingJobStatus"] not in TERMINAL_STATUSES:
            self._record_end(TrainingJobStatus="Stopped")
            with contextlib.suppress(OSError):
                self.job_dir.add_transition("Stopped", "Training job stopped (its supervisor "
                                                       "was gone; its processes were ended)")

    def _wait_for_supervisor_exit(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self._supervisor_alive() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS / 4)


def _is_terminal(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _description(spec: JobSpec, job_dir: JobDirectory, status: dict[str, Any]) -> dict[str, Any]:
    """A DescribeTrainingJob-shaped view of a local job."""
    model = f"file://{output_location(spec, job_dir) / 'model.tar.gz'}"
    output_path = str(output_location(spec, job_dir).parent.parent)
    s3_output = read_destinations(job_dir.root).get("output_path")
    if s3_output:  # a SageMaker cell run locally: the supervisor uploads there, as SageMaker does
        output_path = s3_output
        model = f"{s3_output.rstrip('/')}/{spec.job_name}/output/model.tar.gz"
    description = {
        "TrainingJobName": spec.job_name,
        "TrainingJobArn": f"arn:meshtrain:local:::training-job/{spec.job_name}",
        "TrainingJobStatus": status["TrainingJobStatus"],
        "SecondaryStatus": status.get("SecondaryStatus", "Starting"),
        "SecondaryStatusTransitions": status.get("SecondaryStatusTransitions", []),
        "HyperParameters": spec.container_hyperparameters(f"file://{job_dir.sourcedir_tarball}"),
        "Environment": dict(spec.environment),  # names only: the values are never recorded
        "AlgorithmSpecification": {"TrainingImage": spec.image_uri or "local-processes",
                                   "TrainingInputMode": spec.input_mode},
        "ResourceConfig": {"InstanceType": spec.instance_type,
                           "InstanceCount": spec.instance_count,
                           "VolumeSizeInGB": spec.volume_size},
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_run},
        "OutputDataConfig": {"S3OutputPath": output_path},
        "ModelArtifacts": {"S3ModelArtifacts": model},
        "CreationTime": status.get("CreationTime"),
    }
    for key in ("TrainingStartTime", "TrainingEndTime", "FailureReason", "FailedAttempts"):
        if key in status:
            description[key] = status[key]
    replica_groups = replica_groups_of(spec)
    if replica_groups:  # the supervisor's latest figures (fit() polls this 5 times a second)
        figures = status.get("FaultTolerance") or fault_tolerance_summary(
            read_step_records(job_dir.host_paths(h).output_data_dir for h in spec.hosts),
            status.get("FaultToleranceEvents", []), replica_groups)
        description["FaultTolerance"] = {**figures, **status.get("FaultToleranceLayout", {})}
    return description
