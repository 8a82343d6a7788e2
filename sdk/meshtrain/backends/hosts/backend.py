"""What every backend whose hosts run on this machine shares: the job directory under
`jobs_dir`, its creation (exclusive, cleaned up on failure), S3 staging, the detached supervisor,
and finding its jobs again by name.

A backend composes it by subclassing :class:`HostBackend` with its name, its supervisor module,
its handle class and the hooks it needs (`resolve_spec`, `prepare_job`, `starting_message`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtrain.backends.hosts.job import HostTrainingJob
from meshtrain.backends.hosts.layout import (
    JobDirectory,
    checkpoint_folder,
    default_jobs_dir,
    local_path,
    prepare_host,
)
from meshtrain.backends.hosts.lighthouse import check_lighthouse_installed
from meshtrain.backends.hosts.replica_groups import ReplicaGroups, replica_groups_of
from meshtrain.backends.hosts.s3_staging import check_s3_locations, download_checkpoints, stage_s3
from meshtrain.contract import job_environment
from meshtrain.contract.archive import write_sourcedir_tarball
from meshtrain.contract.env import MESHTRAIN_JOB_NAME, MESHTRAIN_JOB_TOKEN
from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.contract.job_environment import MESHTRAIN_JOB_ENVIRONMENT
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.private_files import (
    PRIVATE_DIR_MODE,
    PRIVATE_UMASK,
    home_warning,
    make_private_dir,
    meshtrain_home,
    private_umask,
)
from meshtrain.contract.support import check_fault_tolerance_supported
from meshtrain.job import TERMINAL_STATUSES
from meshtrain.naming import is_generated_name, with_random_suffix

if TYPE_CHECKING:
    from meshtrain.targets import Target

NAME_ATTEMPTS = 20


class HostBackend:
    """Runs jobs whose hosts run on this machine under `jobs_dir` (default ~/.meshtrain/jobs)."""

    name = ""
    title = ""
    """How messages name its jobs ("local", "local Docker")."""
    supervisor_module = ""
    job_class: type[HostTrainingJob] = HostTrainingJob
    supports_fault_tolerance = False
    """Whether its supervisor runs each replica group of a fault-tolerant job on its own."""
    fault_tolerance_refusal = "its supervisor restarts every host together"
    """Why a backend without that support refuses torch_distributed.fault_tolerance."""

    def __init__(self, target: Target | None = None,
                 jobs_dir: str | Path | None = None) -> None:
        self.target = target
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
        self._check_fault_tolerance(spec)
        if not is_generated_name(spec.job_name) and self.job_directory(spec.job_name).root.exists():
            raise _name_taken(spec.job_name, self.jobs_dir)

    def _check_fault_tolerance(self, spec: JobSpec) -> None:
        """A fault-tolerant job needs this backend's support, whole hosts per replica group and
        torchft's lighthouse on this machine (refused before anything exists)."""
        replica_groups = replica_groups_of(spec)
        if not replica_groups:
            return
        if not self.supports_fault_tolerance:
            check_fault_tolerance_supported(replica_groups, f"{self.title} jobs",
                                            self.fault_tolerance_refusal)
        ReplicaGroups.of(list(spec.hosts), replica_groups)
        check_lighthouse_installed("beside this Python")

    def submit(self, spec: JobSpec) -> HostTrainingJob:
        """Create the job directory (exclusively), prepare every host and start the supervisor.

        A generated name that another submitter took in the same millisecond gets a random
        suffix. A failure to write the job directory (a full disk) removes what was made and
        raises JobFailedError naming the path: no job is left half made or InProgress.
        """
        self.validate(spec)
        spec = self.resolve_spec(spec)
        with private_umask():  # every file of the job is its owner's alone, whatever the umask
            return self._submit(spec)

    def _submit(self, spec: JobSpec) -> HostTrainingJob:
        spec, job_dir = self._create_job_directory(spec)
        token = secrets.token_hex(16)
        try:
            spec = stage_s3(spec, job_dir.root)  # S3 channels downloaded, S3 outputs recorded
            job_dir.token_file.write_text(token)
            job_dir.backend_file.write_text(self.name)
            job_dir.spec_file.write_text(spec.to_record_json())  # environment values masked
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
            _start_supervisor(job_dir, spec, token, self.supervisor_module)
        except OSError as error:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise JobFailedError(spec.job_name, _os_error_reason(job_dir.root, error)) from None
        except BaseException:
            shutil.rmtree(job_dir.root, ignore_errors=True)
            raise
        return self.attach(spec.job_name)

    def resolve_spec(self, spec: JobSpec) -> JobSpec:
        """What a backend settles before anything exists (the Docker backend: its image)."""
        return spec

    def prepare_job(self, spec: JobSpec, job_dir: JobDirectory, token: str) -> None:
        """A backend's own files in the job directory, written before the supervisor starts."""

    def starting_message(self, spec: JobSpec) -> str:
        return "Starting the training job"

    def _create_job_directory(self, spec: JobSpec) -> tuple[JobSpec, JobDirectory]:
        """mkdir the job directory exclusively (0700): two submitters never share one."""
        name = spec.job_name
        try:
            self._make_jobs_dir()
            for _ in range(NAME_ATTEMPTS):
                try:
                    self.job_directory(name).root.mkdir(mode=PRIVATE_DIR_MODE)
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

    def _make_jobs_dir(self) -> None:
        """jobs_dir, and MESHTRAIN_HOME above the default one, made 0700 when meshtrain
        creates them; one warning line for an existing MESHTRAIN_HOME open to others."""
        home = meshtrain_home()
        if self.jobs_dir == default_jobs_dir() and not make_private_dir(home, parents=True):
            warning = home_warning(home)
            if warning:
                print(f"meshtrain: warning: {warning}", file=sys.stderr)
        make_private_dir(self.jobs_dir, parents=True)

    def load_spec(self, job_name: str) -> JobSpec:
        if not self.owns(job_name):
            raise ConfigError(f"no {self.title} job named {job_name!r} in {self.jobs_dir}")
        return self.job_directory(job_name).read_spec()

    def attach(self, job_name: str) -> HostTrainingJob:
        self.load_spec(job_name)
        return self.job_class(job_name, self.job_directory(job_name))

    # --- the job registry -------------------------------------------------------------------

    def owns(self, job_name: str) -> bool:
        """Whether `jobs_dir` holds a job of this backend called `job_name`."""
        job_dir = self.job_directory(job_name)
        with readable(self.jobs_dir):
            return job_dir.spec_file.exists() and job_dir.read_backend() == self.name

    def find(self, job_name: str) -> HostTrainingJob | None:
        """The handle of this backend's job called `job_name`, or None."""
        return self.attach(job_name) if self.owns(job_name) else None

    def job_names(self) -> list[str]:
        """Every job of this backend under `jobs_dir` (for listing and a did-you-mean)."""
        with readable(self.jobs_dir):
            if not self.jobs_dir.is_dir():
                return []
            return sorted(spec.parent.name for spec in self.jobs_dir.glob("*/spec.json")
                          if self.owns(spec.parent.name))

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Name, status, times and failure reason of every job of this backend, newest first
        (a running job's status is checked: a dead supervisor shows as Failed)."""
        rows = []
        for name in self.job_names():
            try:
                rows.append(self.attach(name).summary())
            except (OSError, ValueError, ConfigError):
                continue  # a job directory being created or removed right now
        rows.sort(key=lambda row: row.get("CreationTime") or 0, reverse=True)
        return rows[:limit]

    def remove(self, job_name: str) -> None:
        """Delete an ended job's directory (its logs, model and checkpoints under it), after
        ending any process it left; ConfigError for a job still running."""
        job = self.attach(job_name)
        job.check_owner("remove")
        status = job.status
        if status not in TERMINAL_STATUSES:
            raise ConfigError(f"job {job_name} is {status}: stop it first (`meshtrain stop "
                              f"{job_name}`), then remove it.")
        job.end_leftover_processes()
        shutil.rmtree(job.job_dir.root)

    def not_found(self, job_name: str) -> str:
        """The same words for every backend of a jobs_dir (local and Docker jobs share it)."""
        return f"no local job {job_name} under {self.jobs_dir}"


@contextlib.contextmanager
def readable(jobs_dir: Path) -> Iterator[None]:
    """Another user's jobs cannot be read (their directories are 0700): a ConfigError that says
    so rather than a PermissionError's traceback."""
    try:
        yield
    except PermissionError as error:
        raise ConfigError(f"cannot read {error.filename or jobs_dir}: permission denied. A "
                          "job's files are its owner's alone: run meshtrain as the user who "
                          f"made the jobs under {jobs_dir}.") from None


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


def _start_supervisor(job_dir: JobDirectory, spec: JobSpec, token: str, module: str) -> None:
    """Start the job's supervisor (`python -m module DIR`) in a session of its own (the job
    outlives this client), with umask 077. It and every process it starts carry the job's
    token, which is how they are found again; the environment's values reach it in its own
    environment (MESHTRAIN_JOB_ENVIRONMENT), never in a file."""
    env = {**os.environ, MESHTRAIN_JOB_NAME: spec.job_name, MESHTRAIN_JOB_TOKEN: token,
           MESHTRAIN_JOB_ENVIRONMENT: job_environment.encode(spec.environment)}
    with open(job_dir.root / "supervisor.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(job_dir.root)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, umask=PRIVATE_UMASK,
        )
    try:
        job_dir.supervisor_pid_file.write_text(str(proc.pid))
    except OSError:
        proc.kill()  # a supervisor nobody can find again must not run
        proc.wait()
        raise


