"""Local backend: every host is a process tree on this machine, inside the /opt/ml contract."""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meshtrain.backends.local.artifacts import output_location
from meshtrain.backends.local.layout import (
    JobDirectory,
    checkpoint_folder,
    default_jobs_dir,
    local_path,
    prepare_host,
)
from meshtrain.backends.local.processes import carries_token, kill_job_processes, pids_of_job
from meshtrain.backends.local.restarts import STOP_MARGIN_SECONDS
from meshtrain.backends.local.s3_staging import (
    check_s3_locations,
    download_checkpoints,
    read_destinations,
    stage_s3,
)
from meshtrain.contract.archive import write_sourcedir_tarball
from meshtrain.contract.env import MESHTRAIN_JOB_NAME, MESHTRAIN_JOB_TOKEN
from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.display import JobDisplay, host_index, make_display
from meshtrain.job import TERMINAL_STATUSES, TrainingJob
from meshtrain.naming import is_generated_name, with_random_suffix
from meshtrain.progress import total_steps_from

POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 10.0
NAME_ATTEMPTS = 20


class LocalBackend:
    """Runs jobs as local processes under `jobs_dir` (default ~/.meshtrain/jobs)."""

    name = "local"
    supervisor_module = "meshtrain.backends.local.supervisor"

    def __init__(self, jobs_dir: str | Path | None = None, **_ignored: Any) -> None:
        self.jobs_dir = Path(jobs_dir) if jobs_dir else default_jobs_dir()

    def job_directory(self, job_name: str) -> JobDirectory:
        return JobDirectory(self.jobs_dir / job_name)

    def validate(self, spec: JobSpec) -> None:
        if spec.source_dir.startswith("s3://"):
            raise ConfigError(f"source_dir={spec.source_dir}: local jobs pack a local directory "
                              "or script. Download and unpack the tarball, or run on SageMaker.")
        for name in ("max_wait",):
            if getattr(spec, name):
                raise ConfigError(f"{name} is not supported by local jobs: remove it or run on "
                                  "SageMaker (an ml.* instance_type).")
        if spec.use_spot_instances:
            raise ConfigError("use_spot_instances is not supported by local jobs.")
        _check_local_locations(check_s3_locations(spec))
        if not is_generated_name(spec.job_name) and self.job_directory(spec.job_name).root.exists():
            raise _name_taken(spec.job_name, self.jobs_dir)

    def submit(self, spec: JobSpec) -> LocalTrainingJob:
        """Create the job directory (exclusively), prepare every host and start the supervisor.

        A generated name that another submitter took in the same millisecond gets a random
        suffix. A failure to write the job directory (a full disk) removes what was made and
        raises JobFailedError naming the path: no job is left half made or InProgress.
        """
        self.validate(spec)
        spec = self.resolve_spec(spec)
        spec, job_dir = self._create_job_directory(spec)
        token = secrets.token_hex(16)
        try:
            spec = stage_s3(spec, job_dir.root)  # S3 channels downloaded, S3 outputs recorded
            job_dir.token_file.write_text(token)
            job_dir.spec_file.write_text(spec.to_json())
            write_sourcedir_tarball(Path(spec.source_dir), job_dir.sourcedir_tarball,
                                    [Path(d) for d in spec.dependencies])
            for host in spec.hosts:
                prepare_host(spec, job_dir, host)
            download_checkpoints(job_dir.root, checkpoint_folder(spec, job_dir))
            self.prepare_job(spec, job_dir, token)
            job_dir.write_status(TrainingJobStatus="InProgress", CreationTime=time.time(),
                                 SecondaryStatusTransitions=[])
            job_dir.add_transition("Starting", self.starting_message(spec))
            job_dir.log_file.touch()
            _start_supervisor(job_dir, spec.job_name, token, self.supervisor_module)
        except OSError as error:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise JobFailedError(spec.job_name, _os_error_reason(job_dir.root, error)) from None
        except BaseException:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise
        return self.attach(spec.job_name)

    def resolve_spec(self, spec: JobSpec) -> JobSpec:
        """What a subclass settles before anything exists (the Docker backend: its image)."""
        return spec

    def prepare_job(self, spec: JobSpec, job_dir: JobDirectory, token: str) -> None:
        """A subclass's own files in the job directory, written before the supervisor starts."""

    def starting_message(self, spec: JobSpec) -> str:
        return "Starting the training job"

    def _create_job_directory(self, spec: JobSpec) -> tuple[JobSpec, JobDirectory]:
        """mkdir the job directory exclusively: two submitters never share one."""
        name = spec.job_name
        try:
            self.jobs_dir.mkdir(parents=True, exist_ok=True)
            for _ in range(NAME_ATTEMPTS):
                try:
                    self.job_directory(name).root.mkdir()
                    break
                except FileExistsError:
                    if not is_generated_name(spec.job_name):
                        raise _name_taken(name, self.jobs_dir) from None
                    name = with_random_suffix(spec.job_name)
            else:
                raise _name_taken(name, self.jobs_dir)
        except OSError as error:
            raise JobFailedError(name, _os_error_reason(self.jobs_dir / name, error)) from None
        if name != spec.job_name:
            spec = spec.model_copy(update={"job_name": name})
        return spec, self.job_directory(name)

    def load_spec(self, job_name: str) -> JobSpec:
        job_dir = self.job_directory(job_name)
        if not job_dir.spec_file.exists():
            raise ConfigError(f"no local job named {job_name!r} in {self.jobs_dir}")
        return job_dir.read_spec()

    def attach(self, job_name: str) -> LocalTrainingJob:
        self.load_spec(job_name)
        return LocalTrainingJob(job_name, self.job_directory(job_name))


def _check_local_locations(spec: JobSpec) -> None:
    """Channels and the output are on this machine (not S3, not Kubernetes volumes)."""
    for channel, uri in spec.inputs.items():
        if uri.startswith(("s3://", "pvc://")):
            raise ConfigError(f"input channel {channel!r} is {uri}: local jobs read local "
                              "paths or file:// URIs. Download the data, or run on the target "
                              "that reads it (SageMaker for s3://, Kubernetes for pvc://).")
        if not local_path(uri).exists():
            raise ConfigError(f"input channel {channel!r}: {uri} does not exist.")
    if spec.output_path and spec.output_path.startswith(("s3://", "pvc://")):
        raise ConfigError(f"output_path={spec.output_path}: local jobs write to a local path "
                          "or file:// URI.")


def _name_taken(name: str, jobs_dir: Path) -> ConfigError:
    return ConfigError(f"a local job named {name!r} already exists in {jobs_dir}. "
                       "Choose another job_name.")


def _os_error_reason(where: Path, error: OSError) -> str:
    path = Path(error.filename) if error.filename else where
    detail = "" if path == where else f" ({path})"
    return (f"ClientError: could not create the local job in {where}{detail}: "
            f"[Errno {error.errno}] {error.strerror or error}. Free some space or choose "
            "another jobs_dir (MESHTRAIN_HOME).")


def _start_supervisor(job_dir: JobDirectory, job_name: str, token: str, module: str) -> None:
    """Start the job's supervisor (`python -m module DIR`) in a session of its own (the job
    outlives this client). It and every process it starts carry the job's token, which is how
    they are found again."""
    env = {**os.environ, MESHTRAIN_JOB_NAME: job_name, MESHTRAIN_JOB_TOKEN: token}
    with open(job_dir.root / "supervisor.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(job_dir.root)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        job_dir.supervisor_pid_file.write_text(str(proc.pid))
    except OSError:
        proc.kill()  # a supervisor nobody can find again must not run
        proc.wait()
        raise


class LocalTrainingJob(TrainingJob):
    """Handle of a local job; every method reads the job directory, so attach() works anywhere."""

    def __init__(self, job_name: str, job_dir: JobDirectory) -> None:
        super().__init__(job_name)
        self.job_dir = job_dir
        self._log_offset = 0

    @property
    def token(self) -> str:
        """The token every process of this job carries (MESHTRAIN_JOB_TOKEN)."""
        return self.job_dir.read_token()

    def end_leftover_processes(self) -> int:
        """A job whose supervisor was killed may leave processes without a lifeline (a script's
        detached children): end every one still carrying the job's token."""
        return kill_job_processes(self.token, grace_seconds=STOP_GRACE_SECONDS)

    def processes(self) -> list[int]:
        """PIDs of this job's processes still running (supervisor, hosts, agents, ranks)."""
        return pids_of_job(self.token)

    def _supervisor_pid(self) -> int | None:
        """The supervisor's PID while it runs: a PID is only trusted if the process carries
        this job's token (a recycled PID belongs to someone else)."""
        try:
            pid = int(self.job_dir.supervisor_pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if carries_token(pid, self.token) else None

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
        if status["TrainingJobStatus"] not in TERMINAL_STATUSES and self._supervisor_gone():
            status = self.job_dir.read_status()  # it may have finished between the two reads
            if status["TrainingJobStatus"] not in TERMINAL_STATUSES:
                status = self._record_end_of_dead_supervisor()
        spec = self.job_dir.read_spec()
        return _description(spec, self.job_dir, status)

    def _show_new_log(self, display: JobDisplay) -> None:
        with open(self.job_dir.log_file, "rb") as log:
            log.seek(self._log_offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._log_offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
            display.log(line, host=host_index(line))

    def wait(self, logs: bool = True) -> None:
        display = make_display(self.job_name, total_steps=total_steps_from(
            self.job_dir.read_spec().hyperparameters)) if logs else None
        try:
            description = self._follow(display)
        except KeyboardInterrupt:
            if display is not None:
                display.close()
            self._stop_on_interrupt()
            # The caller's program stops too, as Ctrl-C means (docs/local-jobs.md); the
            # message replaces the frames of the polling loop the user never wrote.
            raise KeyboardInterrupt(f"training job {self.job_name} was stopped (Ctrl-C)"
                                    ) from None
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

    def _stop_on_interrupt(self) -> None:
        """Ctrl-C while waiting: a local job dies with its client, and says so."""
        print(f"\nStopping job {self.job_name} ... ", end="", flush=True)
        try:
            self.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: leave the supervisor to finish it
            print(f"still stopping in the background; see `meshtrain status {self.job_name}`")
            return
        print(self.job_dir.read_status().get("TrainingJobStatus", "?").lower())

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

    def stop(self) -> None:
        """SIGTERM the supervisor, which ends every host and records the status. If it is gone
        (killed) or does not end, every process still carrying the job's token is ended here
        and the job is recorded as Stopped: the job is terminal when this returns."""
        pid = self._supervisor_pid()
        with contextlib.suppress(OSError):  # a full disk must not keep the job from stopping
            self.job_dir.stop_request_file.touch()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):  # it may end on its own meanwhile
                os.kill(pid, signal.SIGTERM)
            # the ranks' grace period (torch_distributed.stop_grace_seconds), then packing
            grace = self.job_dir.read_spec().distribution_config().torch_distributed
            self._wait_for_supervisor_exit(grace.stop_grace_seconds + STOP_MARGIN_SECONDS + 60)
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
    return description
