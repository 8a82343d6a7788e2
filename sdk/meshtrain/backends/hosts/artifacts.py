"""model.tar.gz and output.tar.gz from the hosts' /opt/ml trees, as SageMaker uploads them."""

from __future__ import annotations

import errno
import os
import shutil
import tarfile
from pathlib import Path

from meshtrain.backends.hosts.layout import JobDirectory, local_path
from meshtrain.contract.jobspec import JobSpec

TAR_OVERHEAD_BYTES = 1024  # a tar header plus padding, per member, at most
PARTIAL_SUFFIX = ".partial"


def output_location(spec: JobSpec, job_dir: JobDirectory) -> Path:
    """`<output_path>/<job>/output`; output_path defaults to the jobs directory."""
    base = local_path(spec.output_path) if spec.output_path else job_dir.root.parent
    return base / spec.job_name / "output"


def _members(directories: list[Path]) -> dict[str, Path]:
    """The files of several trees merged at their roots (later hosts overwrite, as local mode)."""
    members: dict[str, Path] = {}
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                members[path.relative_to(directory).as_posix()] = path
    return members


def _upper_bound(members: dict[str, Path]) -> int:
    """Bytes the archive can take at most (gzip of incompressible data adds next to nothing)."""
    return sum(p.stat().st_size + TAR_OVERHEAD_BYTES for p in members.values()) + 10240


def _write_tar(tarball: Path, members: dict[str, Path]) -> None:
    """Write `tarball` under a temporary name and rename it when complete: a failure (a full
    disk) never leaves a truncated archive behind."""
    partial = tarball.with_name(tarball.name + PARTIAL_SUFFIX)
    try:
        with tarfile.open(partial, "w:gz") as tar:
            for name in sorted(members):
                tar.add(members[name], arcname=name)
        os.replace(partial, tarball)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def package_artifacts(spec: JobSpec, job_dir: JobDirectory,
                      model_hosts: list[str] | None = None) -> str | None:
    """Write model.tar.gz (every host's /opt/ml/model, or `model_hosts`' only: a fault-tolerant
    job keeps its finished replica group's) and output.tar.gz (every host's output/data).

    Returns None, or a failure reason naming the path and the error (a full disk, no
    permission): the free space is checked before packing, and a partial archive is removed.
    """
    target = output_location(spec, job_dir)
    hosts = [job_dir.host_paths(h) for h in spec.hosts]
    models = [job_dir.host_paths(h).model_dir for h in model_hosts or spec.hosts]
    plan = [(target / "model.tar.gz", _members(models)),
            (target / "output.tar.gz", _members([p.output_data_dir for p in hosts]))]
    kept = f"The outputs are kept in {job_dir.root / 'hosts'}/algo-*/opt/ml."
    current = target
    try:
        target.mkdir(parents=True, exist_ok=True)
        needed = sum(_upper_bound(members) for _, members in plan)
        free = shutil.disk_usage(target).free
        if needed > free:
            return (f"ClientError: not enough space to write the outputs to {target}: "
                    f"{errno.errorcode[errno.ENOSPC]}, they need up to {needed} bytes and "
                    f"{free} bytes are free. {kept} Free some space or choose another "
                    "output_path.")
        for current, members in plan:  # `current` names the archive that failed
            _write_tar(current, members)
    except OSError as error:
        detail = error.strerror or str(error)
        where = error.filename or current
        return (f"ClientError: could not write the outputs to {where}: [Errno {error.errno}] "
                f"{detail}. {kept}")
    return None
