"""Provisioning /opt/ml/code: the user's sourcedir.tar.gz, unpacked safely, and requirements.

requirements.txt goes into a per-job environment layered on this interpreter (requirements.py),
never into the interpreter itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.archive import UnsafeArchiveError, safe_extract
from meshtrain.contract.phases import Phase
from meshtrain_runtime.host.contract import HostContract
from meshtrain_runtime.host.phases import announce
from meshtrain_runtime.host.requirements import ProvisionError, activate, requirements_environment


def _download_s3(uri: str, destination: Path, region: str | None) -> Path:
    import boto3  # only on SageMaker-style hosts

    bucket, _, key = uri.removeprefix("s3://").partition("/")
    target = destination / "sourcedir.tar.gz"
    boto3.client("s3", region_name=region).download_file(bucket, key, str(target))
    return target


def fetch_submit_directory(submit: str, scratch: Path, region: str | None = None) -> Path | None:
    """A local path to the tarball (or directory) named by sagemaker_submit_directory."""
    if not submit:
        return None
    if submit.startswith("s3://"):
        return _download_s3(submit, scratch, region)
    return Path(submit.removeprefix("file://"))


def provision_code(contract: HostContract) -> Path:
    """Unpack the source into the code dir, install requirements.txt; return the script path."""
    code_dir = contract.code_dir
    code_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        source = fetch_submit_directory(
            str(contract.reserved.get(hp.SUBMIT_DIRECTORY, "")), Path(scratch),
            contract.reserved.get(hp.REGION))
        if source is not None and source.is_file():
            try:
                safe_extract(source, code_dir)
            except UnsafeArchiveError as error:
                raise ProvisionError(f"refusing the source archive {source}: {error}") from None
    script = code_dir / contract.entry_point
    if not script.is_file():
        raise ProvisionError(f"entry point {contract.entry_point!r} is not in {code_dir}")
    requirements = contract.requirements_file
    if requirements is not None and requirements.is_file():
        announce(Phase.REQUIREMENTS, f"{contract.current_host} installs requirements.txt")
        activate(requirements_environment(requirements))
    return script
