"""A ModelTrainer job (SDK v3) on SageMaker: its S3 staging, drivers and CreateTrainingJob.

The request is the SDK's for the same arguments (``ModelTrainer._create_training_job_args``
and sagemaker-core's ``TrainingJob.create``): the code as a ``code`` channel and local channels
uploaded under ``<input_s3_key_prefix or base job name>/<job>/input/<channel>`` of the default
bucket (or of the output path when IAM says the role cannot write the default bucket), an
``sm_drivers`` channel last, the container started by ``/bin/bash`` running its
``sm_train.sh``. Only the drivers are meshtrain's: its start script, a copy of the runtime and
the job's keys (`JOB_FILE`), so the host runs meshtrain's bootstrap on any image with Python.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Protocol

from meshtrain.backends.sagemaker.request import RequestContext
from meshtrain.backends.sagemaker.shipping import RUNTIME_REQUIREMENTS, stage_runtime
from meshtrain.contract import model_trainer as mt
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.paths import DEFAULT_BASE_DIR, OptMLPaths

CODE_DIRECTORY = str(OptMLPaths(Path(DEFAULT_BASE_DIR)).channel_dir(mt.CODE_CHANNEL))
RUNTIME_ARCHIVE = "meshtrain-runtime.tar.gz"
START_SCRIPT = f"""#!/bin/bash
# meshtrain's driver for a SageMaker SDK v3 (ModelTrainer) job. The request starts this script
# as the SDK starts its own; it hands the host to meshtrain's bootstrap: the runtime packed
# beside it ({RUNTIME_ARCHIVE}), which reads the job's keys from {mt.JOB_FILE}.
set -e
DRIVERS="$(cd "$(dirname "$0")" && pwd)"
PYTHON=$(command -v python3 || command -v python)
RUNTIME=$(mktemp -d "${{TMPDIR:-/tmp}}/meshtrain-runtime.XXXXXX")
"$PYTHON" - "$DRIVERS/{RUNTIME_ARCHIVE}" "$RUNTIME" <<'EOF'
import sys, tarfile
safe = {{"filter": "data"}} if hasattr(tarfile, "data_filter") else {{}}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **safe)
EOF
export PYTHONPATH="$RUNTIME${{PYTHONPATH:+:$PYTHONPATH}}"
if ! "$PYTHON" -c "import pydantic" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet {" ".join(f'"{r}"' for r in RUNTIME_REQUIREMENTS)}
fi
exec "$PYTHON" -m meshtrain_runtime.host.bootstrap
"""


def key_prefix(spec: JobSpec, channel: str, staging_prefix: str | None) -> str:
    """``[<staging prefix>/]<input_s3_key_prefix or base>/<job>/input/<channel>``."""
    trainer = spec.model_trainer
    root = trainer.input_s3_key_prefix or trainer.base_job_name
    prefix = f"{root}/{spec.job_name}/input/{channel}"
    return f"{staging_prefix}/{prefix}" if staging_prefix else prefix


def _files(path: Path, ignore: list[str]) -> list[tuple[Path, str]]:
    """(file, key below the prefix) of a file or a folder, `ignore` patterns matched against
    each name as shutil.ignore_patterns does when the SDK copies the folder."""
    if path.is_file():
        return [(path, path.name)]
    found = []
    for directory, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames
                             if not any(fnmatch.fnmatch(d, p) for p in ignore))
        for name in sorted(filenames):
            if not any(fnmatch.fnmatch(name, p) for p in ignore):
                found.append((Path(directory, name),
                              str(Path(directory, name).relative_to(path))))
    return found


class StagingBackend(Protocol):
    """What staging needs of the SageMaker backend (which imports this module)."""

    options: Any

    def account_id(self) -> str: ...

    def client(self, service: str) -> Any: ...


class Staging:
    """Where a job's local files go in S3 (the SDK's `_resolve_staging_bucket`), and the
    uploads themselves (its `upload_data`)."""

    def __init__(self, backend: StagingBackend, spec: JobSpec, role_arn: str,
                 default_bucket: str, output_path: str) -> None:
        self.backend, self.spec, self.role_arn = backend, spec, role_arn
        self.bucket, self.prefix = default_bucket, None
        self.default_bucket = default_bucket
        self._choose(output_path)
        kms = spec.model_trainer.output.get("KmsKeyId")
        self.extra: dict[str, Any] = (
            {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms} if kms else {})
        if self.bucket == default_bucket and backend.options.default_bucket is None:
            self.extra["ExpectedBucketOwner"] = backend.account_id()

    def _choose(self, output_path: str) -> None:
        """The output path's bucket and prefix when IAM says the role cannot write the default
        bucket (any error asking it keeps the default bucket, as in the SDK)."""
        try:
            result = self.backend.client("iam").simulate_principal_policy(
                PolicySourceArn=self.role_arn, ActionNames=["s3:PutObject"],
                ResourceArns=[f"arn:aws:s3:::{self.default_bucket}/*"])
        except Exception:
            return
        decisions = result.get("EvaluationResults", [])
        if decisions and decisions[0].get("EvalDecision") != "allowed" and (
                output_path.startswith("s3://")):
            bucket, _, prefix = output_path.removeprefix("s3://").partition("/")
            if bucket:
                self.bucket, self.prefix = bucket, prefix.strip("/")

    def upload(self, channel: str, path: Path, ignore: list[str] | None = None) -> str:
        """Upload a file or folder for `channel`; its S3 URI as the SDK returns it."""
        prefix = key_prefix(self.spec, channel, self.prefix)
        s3 = self.backend.client("s3")
        for local, key in _files(path, ignore or []):
            s3.put_object(Bucket=self.bucket, Key=f"{prefix}/{key}", Body=local.read_bytes(),
                          **self.extra)
        uri = f"s3://{self.bucket}/{prefix}"
        return f"{uri}/{path.name}" if path.is_file() else uri


def s3_channel(name: str, uri: str) -> dict[str, Any]:
    """The channel the SDK makes for an S3 URI or an uploaded path."""
    return {"ChannelName": name,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File"}


def write_drivers(spec: JobSpec, directory: Path) -> None:
    """meshtrain's drivers channel: the start script, the job's keys and the runtime (one
    archive: a few uploads, not one per module)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / mt.TRAIN_SCRIPT).write_text(START_SCRIPT)
    (directory / mt.TRAIN_SCRIPT).chmod(0o755)
    job_keys = spec.job_hyperparameters(CODE_DIRECTORY)
    (directory / mt.JOB_FILE).write_text(json.dumps(job_keys, indent=2, sort_keys=True))
    with tempfile.TemporaryDirectory(prefix="meshtrain-runtime-") as scratch:
        packages = stage_runtime(Path(scratch) / "runtime")  # copies, or the installed package
        with tarfile.open(directory / RUNTIME_ARCHIVE, "w:gz") as archive:
            for package in packages:
                archive.add(package, arcname=package.name, filter=_no_bytecode)


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info


def stage_channels(spec: JobSpec, staging: Staging) -> list[dict[str, Any]]:
    """The request's channels: the user's (local ones uploaded), then code and drivers."""
    channels = []
    for name, uri in spec.inputs.items():
        config = spec.input_configs.get(name)
        if config is not None:
            channels.append({"ChannelName": name, **config})
            continue
        channel = s3_channel(name, staging.upload(name, Path(uri.removeprefix("file://"))))
        if spec.input_content_types.get(name):
            channel["ContentType"] = spec.input_content_types[name]
        channels.append(channel)
    source = spec.model_trainer.source_code
    channels.append(s3_channel(mt.CODE_CHANNEL, staging.upload(
        mt.CODE_CHANNEL, Path(spec.source_dir), source.get("ignore_patterns") or [])))
    with tempfile.TemporaryDirectory(prefix="meshtrain-drivers-") as scratch:
        drivers = Path(scratch) / mt.DRIVERS_CHANNEL
        write_drivers(spec, drivers)
        channels.append(s3_channel(mt.DRIVERS_CHANNEL, staging.upload(mt.DRIVERS_CHANNEL,
                                                                      drivers)))
    return channels


def _with_defaults(fields: dict[str, Any], spec: JobSpec, bucket: str) -> dict[str, Any]:
    """A checkpoint or TensorBoard config without its S3 location gets the SDK's default."""
    base = spec.model_trainer.base_job_name
    fields = {key: dict(value) if isinstance(value, dict) else value
              for key, value in fields.items()}
    if "CheckpointConfig" in fields and not fields["CheckpointConfig"].get("S3Uri"):
        fields["CheckpointConfig"] = {
            "S3Uri": f"s3://{bucket}/{base}/{spec.job_name}/checkpoints",
            **fields["CheckpointConfig"]}
    board = fields.get("TensorBoardOutputConfig")
    if board is not None and not board.get("S3OutputPath"):
        fields["TensorBoardOutputConfig"] = {"S3OutputPath": f"s3://{bucket}/{base}", **board}
    return fields


def build_request(spec: JobSpec, ctx: RequestContext, channels: list[dict[str, Any]],
                  default_bucket: str) -> dict[str, Any]:
    """The keyword arguments of ``create_training_job``, as SDK v3 sends them."""
    trainer = spec.model_trainer
    algorithm: dict[str, Any] = {"TrainingInputMode": spec.input_mode,
                                 "TrainingImage": ctx.image_uri}
    if spec.metric_definitions:
        algorithm["MetricDefinitions"] = [dict(m) for m in spec.metric_definitions]
    algorithm.update(ContainerEntrypoint=list(mt.CONTAINER_ENTRYPOINT),
                     ContainerArguments=list(mt.CONTAINER_ARGUMENTS), **trainer.algorithm)
    request: dict[str, Any] = {
        "TrainingJobName": spec.job_name,
        "HyperParameters": spec.request_hyperparameters(),
        "AlgorithmSpecification": algorithm,
        "RoleArn": ctx.role_arn,
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": ctx.output_path, **trainer.output},
        "ResourceConfig": dict(trainer.resources),
        "StoppingCondition": dict(trainer.stopping),
    }
    if spec.tags:
        request["Tags"] = [dict(tag) for tag in spec.tags]
    request.update(_with_defaults(trainer.request, spec, default_bucket))
    if spec.environment:
        request["Environment"] = dict(spec.environment)
    return request


def default_output_path(spec: JobSpec, bucket: str) -> str:
    """``s3://<default bucket>/<base job name>`` (the SDK's default output location)."""
    return f"s3://{bucket}/{spec.model_trainer.base_job_name}"
