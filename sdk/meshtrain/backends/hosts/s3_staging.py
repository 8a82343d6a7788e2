"""S3 for local jobs: a SageMaker notebook's S3 inputs, output_path and checkpoint_s3_uri.

What SageMaker does around a job, done on this machine with boto3 (credentials and endpoints
from boto3's standard chain, e.g. ``AWS_PROFILE`` or ``AWS_ENDPOINT_URL``):

- before the job (client side, at `fit()`): every object under an S3 channel's prefix is
  downloaded with boto3's transfer manager into ``<job>/s3/channels/<channel>/``, which the hosts'
  ``/opt/ml/input/data/<channel>`` then link to; objects under ``checkpoint_s3_uri`` are
  downloaded into every host's checkpoint folder (SageMaker's resume);
- after the job (by the supervisor, which outlives the client): ``model.tar.gz`` and
  ``output.tar.gz`` are uploaded to ``<output_path>/<job>/output/`` and the hosts' checkpoint
  folders to ``checkpoint_s3_uri``.

The job's own spec then holds local locations; ``<job>/s3.json`` keeps the S3 ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from meshtrain.backends.s3_uri import parse_s3_uri
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec

STAGING_FILE = "s3.json"
CHANNELS_DIR = ("s3", "channels")


def _parse(uri: str, what: str) -> tuple[str, str]:
    return parse_s3_uri(uri, what)


def _s3_inputs(spec: JobSpec) -> dict[str, str]:
    return {c: uri for c, uri in spec.inputs.items() if uri.startswith("s3://")}


def check_s3_locations(spec: JobSpec) -> JobSpec:
    """Check the S3 locations (no request) and return the spec without them, for the local
    checks of what is left. Only what local hosts can reproduce is accepted."""
    for channel, uri in _s3_inputs(spec).items():
        _parse(uri, f"input channel {channel!r}")
        config = spec.input_configs.get(channel, {})
        source = config.get("DataSource", {}).get("S3DataSource", {})
        if source.get("S3DataType", "S3Prefix") != "S3Prefix" or config.get("InputMode") == "Pipe":
            raise ConfigError(f"input channel {channel!r}: local jobs download S3Prefix channels "
                              "in File/FastFile mode; manifests and Pipe mode need SageMaker "
                              "(an ml.* instance_type).")
        if source.get("S3DataDistributionType", "FullyReplicated") != "FullyReplicated":
            raise ConfigError(f"input channel {channel!r}: local jobs give every host all the "
                              "data (FullyReplicated), as SageMaker's local mode; drop "
                              "distribution='ShardedByS3Key' or run on SageMaker.")
    for channel, config in spec.input_configs.items():
        if "FileSystemDataSource" in config.get("DataSource", {}):
            raise ConfigError(f"input channel {channel!r} is an EFS/FSx file system, which only "
                              "SageMaker jobs in its VPC can mount: give a local path, an S3 URI, "
                              "or run on SageMaker.")
    for what in ("output_path", "checkpoint_s3_uri"):
        value = getattr(spec, what)
        if value and value.startswith("s3://"):
            _parse(value, what)
    return local_spec(spec, {})


def local_spec(spec: JobSpec, staged: dict[str, Path]) -> JobSpec:
    """The spec the hosts run: staged channels as file:// URIs, no S3 output or checkpoints."""
    inputs = {c: uri for c, uri in spec.inputs.items()
              if not uri.startswith("s3://") and c not in _file_systems(spec)}
    inputs.update({c: f"file://{path}" for c, path in staged.items()})
    output = spec.output_path
    return spec.model_copy(update={
        "inputs": inputs,
        "output_path": None if output and output.startswith("s3://") else output,
        "checkpoint_s3_uri": None,
    })


def _file_systems(spec: JobSpec) -> set[str]:
    return {c for c, config in spec.input_configs.items()
            if "FileSystemDataSource" in config.get("DataSource", {})}


def _client() -> Any:
    import boto3

    return boto3.client("s3")


def download_prefix(uri: str, target: Path, what: str) -> int:
    """Download every object under `uri` into `target` (keys relative to the prefix); returns
    how many. The transfer manager (`download_file`) splits large objects into parts."""
    bucket, prefix = _parse(uri, what)
    s3, count = _client(), 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):].lstrip("/") or Path(item["Key"]).name
            if item["Key"].endswith("/"):
                continue  # a folder marker
            destination = target / relative
            if ".." in Path(relative).parts:
                raise ConfigError(f"{what}: refusing S3 key {item['Key']!r} (it would land "
                                  f"outside {target}).")
            destination.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(destination))
            count += 1
    return count


def stage_s3(spec: JobSpec, job_root: Path) -> JobSpec:
    """Download the S3 channels, record the S3 destinations; the spec the hosts will run."""
    staged = {}
    for channel, uri in _s3_inputs(spec).items():
        target = job_root.joinpath(*CHANNELS_DIR, channel)
        target.mkdir(parents=True)
        try:
            count = download_prefix(uri, target, f"input channel {channel!r}")
        except (BotoCoreError, ClientError) as error:
            raise ConfigError(f"input channel {channel!r}: could not download {uri}: {error}. "
                              "Check the URI and boto3's credentials (AWS_PROFILE, ...).") from None
        if count == 0:
            raise ConfigError(f"input channel {channel!r}: no objects under {uri}. Check the "
                              "URI (and the credentials' region).")
        staged[channel] = target
    record = {what: getattr(spec, what) for what in ("output_path", "checkpoint_s3_uri")
              if (getattr(spec, what) or "").startswith("s3://")}
    (job_root / STAGING_FILE).write_text(json.dumps(record))
    return local_spec(spec, staged)


def read_destinations(job_root: Path) -> dict[str, str]:
    """The S3 output_path / checkpoint_s3_uri a local job uploads to (empty if none)."""
    path = job_root / STAGING_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def download_checkpoints(job_root: Path, checkpoint_dir: Path) -> None:
    """Objects under checkpoint_s3_uri into the job's checkpoint folder (a resume)."""
    uri = read_destinations(job_root).get("checkpoint_s3_uri")
    if uri:
        download_prefix(uri, checkpoint_dir, "checkpoint_s3_uri")


def upload_tree(directory: Path, uri: str, what: str) -> int:
    """Every file under `directory` to `uri` + its relative path; returns how many."""
    bucket, prefix = _parse(uri, what)
    s3, count = _client(), 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        key = "/".join(x for x in (prefix.rstrip("/"), path.relative_to(directory).as_posix()) if x)
        s3.upload_file(str(path), bucket, key)
        count += 1
    return count


def upload_results(job_root: Path, job_name: str, output_dir: Path,
                   checkpoint_dir: Path) -> str | None:
    """After the job: artifacts to <output_path>/<job>/output/, checkpoints to
    checkpoint_s3_uri. Returns None, or a failure reason naming what could not be uploaded."""
    destinations = read_destinations(job_root)
    try:
        if "output_path" in destinations:
            base = destinations["output_path"].rstrip("/")
            upload_tree(output_dir, f"{base}/{job_name}/output", "output_path")
        if "checkpoint_s3_uri" in destinations and checkpoint_dir.is_dir():
            upload_tree(checkpoint_dir, destinations["checkpoint_s3_uri"], "checkpoint_s3_uri")
    except Exception as error:  # boto3's errors: the job's outcome must still be recorded
        return f"ClientError: uploading the job's results to S3 failed: {error}"
    return None

