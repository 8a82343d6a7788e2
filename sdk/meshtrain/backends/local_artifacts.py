"""model.tar.gz and output.tar.gz from the hosts' /opt/ml trees, as SageMaker uploads them."""

from __future__ import annotations

import tarfile
from pathlib import Path

from meshtrain.backends.local_layout import JobDirectory, local_path
from meshtrain.contract.jobspec import JobSpec


def output_location(spec: JobSpec, job_dir: JobDirectory) -> Path:
    """`<output_path>/<job>/output`; output_path defaults to the jobs directory."""
    base = local_path(spec.output_path) if spec.output_path else job_dir.root.parent
    return base / spec.job_name / "output"


def _merge_into_tar(tarball: Path, directories: list[Path]) -> None:
    """One tar.gz of several trees merged at their roots (later hosts overwrite, as local mode)."""
    members: dict[str, Path] = {}
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                members[path.relative_to(directory).as_posix()] = path
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "w:gz") as tar:
        for name in sorted(members):
            tar.add(members[name], arcname=name)


def package_artifacts(spec: JobSpec, job_dir: JobDirectory) -> None:
    """Write model.tar.gz (every host's /opt/ml/model) and output.tar.gz (output/data)."""
    target = output_location(spec, job_dir)
    hosts = [job_dir.host_paths(h) for h in spec.hosts]
    _merge_into_tar(target / "model.tar.gz", [p.model_dir for p in hosts])
    _merge_into_tar(target / "output.tar.gz", [p.output_data_dir for p in hosts])
