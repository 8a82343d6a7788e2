"""The on-disk layout of a job whose hosts run on this machine: one /opt/ml tree per host,
logs, status."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshtrain.contract.jobspec import JobSpec, write_host_config
from meshtrain.contract.paths import OptMLPaths
from meshtrain.contract.private_files import meshtrain_home, write_private_bytes

# status.json is padded to this size so that, on a full disk, the final status can still be
# written over the file's own blocks (JSON allows trailing whitespace).
STATUS_RESERVE_BYTES = 8192
READ_RETRIES = 20


def default_jobs_dir() -> Path:
    """`$MESHTRAIN_HOME/jobs`, by default ~/.meshtrain/jobs."""
    return meshtrain_home() / "jobs"


def source_root(spec: JobSpec) -> str:
    """The folder on this machine that the job's code dir is a copy of: source_dir, or the
    script's folder when the script alone was sent (its code dir holds just the script)."""
    source = Path(spec.source_dir)
    return str(source.parent if source.is_file() else source)


def local_path(uri: str) -> Path:
    """A file:// URI or a plain path as a Path."""
    return Path(uri.removeprefix("file://")).expanduser()


@dataclass(frozen=True)
class JobDirectory:
    """Everything a local job keeps under `<jobs_dir>/<job_name>`."""

    root: Path

    @property
    def spec_file(self) -> Path:
        return self.root / "spec.json"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    @property
    def log_file(self) -> Path:
        return self.root / "job.log"

    @property
    def supervisor_pid_file(self) -> Path:
        return self.root / "supervisor.pid"

    @property
    def stop_request_file(self) -> Path:
        """Written by stop() before it signals: a supervisor found dead after it was asked to
        stop (it may die of the SIGTERM before its handler is installed) was stopped, not lost."""
        return self.root / "stop-requested"

    @property
    def token_file(self) -> Path:
        return self.root / "job.token"

    @property
    def backend_file(self) -> Path:
        """The name of the backend that made the job (a jobs_dir holds local and Docker jobs)."""
        return self.root / "backend"

    def read_backend(self) -> str:
        """Which backend made the job; "local" for one made before the file existed."""
        try:
            return self.backend_file.read_text().strip() or "local"
        except OSError:
            return "local"

    def read_token(self) -> str:
        """The job's process token ('' for a job directory without one)."""
        try:
            return self.token_file.read_text().strip()
        except OSError:
            return ""

    @property
    def sourcedir_tarball(self) -> Path:
        return self.root / "source" / "sourcedir.tar.gz"

    def host_paths(self, host: str) -> OptMLPaths:
        return OptMLPaths(self.root / "hosts" / host / "opt" / "ml")

    def host_work_dir(self, host: str) -> Path:
        """The host's own scratch (torchrun logs, rank failure records), beside its /opt/ml."""
        return self.root / "hosts" / host / "work"

    def host_log(self, host: str) -> Path:
        return self.root / "logs" / f"{host}.log"

    def read_spec(self) -> JobSpec:
        return JobSpec.from_json(self.spec_file.read_text())

    def read_status(self) -> dict[str, Any]:
        for _ in range(READ_RETRIES):  # an in-place write (full disk only) may be half done
            try:
                return json.loads(self.status_file.read_text())
            except ValueError:
                time.sleep(0.05)
        return json.loads(self.status_file.read_text())

    def write_status(self, **changes: Any) -> dict[str, Any]:
        """Merge `changes` into status.json atomically (readers never see half a file).

        On a full disk the new file cannot be made: the status is then written over the old
        file's own (padded) blocks, so a terminal status is recorded even then.
        """
        status = self.read_status() if self.status_file.exists() else {}
        status.update(changes)
        text = json.dumps(status, indent=2)
        data = (text + " " * max(0, STATUS_RESERVE_BYTES - len(text) - 1) + "\n").encode()
        tmp = self.status_file.with_suffix(".tmp")
        try:
            write_private_bytes(tmp, data)
            tmp.replace(self.status_file)
        except OSError:
            tmp.unlink(missing_ok=True)
            if not self.status_file.exists():
                raise
            with open(self.status_file, "r+b") as handle:
                handle.write(data)
                handle.truncate()
        return status

    def add_transition(self, secondary: str, message: str) -> None:
        status = self.read_status()
        transitions = status.get("SecondaryStatusTransitions", [])
        now = time.time()
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = now
        transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": message})
        self.write_status(SecondaryStatus=secondary, SecondaryStatusTransitions=transitions)


def prepare_host(spec: JobSpec, job_dir: JobDirectory, host: str) -> OptMLPaths:
    """Create one host's /opt/ml tree: config files and channels (linked, not copied)."""
    paths = job_dir.host_paths(host)
    paths.make_dirs()
    submit = f"file://{job_dir.sourcedir_tarball}"
    write_host_config(spec, paths.input_config_dir, host, submit)
    for channel, uri in spec.inputs.items():
        source = local_path(uri).resolve()
        target = paths.channel_dir(channel)
        if source.is_dir():
            target.symlink_to(source, target_is_directory=True)
        else:  # a single file is made available inside the channel directory
            target.mkdir(parents=True)
            (target / source.name).symlink_to(source)
    return paths


def checkpoint_folder(spec: JobSpec, job_dir: JobDirectory) -> Path:
    """The job's one checkpoint folder, shared by all its hosts (SM_CHECKPOINT_DIR):
    checkpoint_local_path if given (reused across jobs), else ``<job dir>/checkpoints``, as
    SageMaker syncs every host's /opt/ml/checkpoints to one S3 prefix."""
    if spec.checkpoint_local_path:
        return Path(spec.checkpoint_local_path)
    return job_dir.root / "checkpoints"
