"""meshtrain's ModelTrainer sends SageMaker the CreateTrainingJob the real SDK v3 sends.

Each notebook cell of v3_cells.py runs twice against moto over HTTP: once with the real
SageMaker Python SDK 3.27.0 (its own environment, a subprocess: sdk_v3_env.py), once here with
the import line switched to `meshtrain.sagemaker`. The two requests must be equal field by field
once the job names (a timestamp each) are put aside, the container start and the `sm_drivers`
channel's location included (only that channel's content is meshtrain's own), and the objects
uploaded for the code and the local channels must have the same keys.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest
from v3_cells import CELLS, DATA_BUCKET, DEFAULT_BUCKET, REGION, make_files, prelude
from sdk_v3_env import sdk_environment, sdk_python

RUNNER = Path(__file__).resolve().parent / "sdk_cells_runner.py"
JOB = "<job>"

pytestmark = pytest.mark.multiprocess  # the SDK runs in a process (and environment) of its own


def s3_client(endpoint: str | None) -> object:
    """S3 of the environment (`aws`), or of moto at `endpoint` with moto's test credentials."""
    if endpoint is None:
        return boto3.client("s3")
    return boto3.client("s3", region_name=REGION, endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def create_buckets(endpoint: str | None = None) -> None:
    s3 = s3_client(endpoint)
    s3.create_bucket(Bucket=DATA_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})


def normalised(request: dict) -> dict:
    """The request with its job name (base + timestamp) written as <job> wherever it is."""
    return json.loads(json.dumps(request).replace(request["TrainingJobName"], JOB))


def uploaded_keys(job_name: str, endpoint: str | None = None) -> list[str]:
    """Keys uploaded for `job_name`'s code and local channels (not its drivers), normalised."""
    s3 = s3_client(endpoint)
    keys = []
    for bucket in (DEFAULT_BUCKET, DATA_BUCKET):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        keys += [f"{bucket}/{item['Key']}" for page in pages for item in page.get("Contents", [])
                 if f"/{job_name}/" in item["Key"] and "/input/sm_drivers/" not in item["Key"]]
    return sorted(key.replace(job_name, JOB) for key in keys)


@pytest.fixture(scope="module")
def sdk_requests(moto_server, tmp_path_factory):
    """Every cell through the real SDK: {cell: (request, uploaded keys)}."""
    python = sdk_python()
    root = tmp_path_factory.mktemp("sdk-cells")
    moto_server.reset()
    create_buckets(moto_server.url)
    given = root / "cells.json"
    given.write_text(json.dumps({"prelude": prelude("sagemaker"), "cells": CELLS,
                                 "namespace": make_files(root / "files")}))
    env = sdk_environment(dict(os.environ), root)
    env.update(AWS_ENDPOINT_URL=moto_server.url, AWS_ACCESS_KEY_ID="testing",
               AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION,
               AWS_CONFIG_FILE=str(root / "none"), AWS_SHARED_CREDENTIALS_FILE=str(root / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    done = subprocess.run([str(python), str(RUNNER), str(given)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = {r["cell"]: r["traceback"] for r in results if r["error"]}
    assert not failed, f"the SDK itself failed on cells: {failed}"
    creates = [r.json() for r in moto_server.find("SageMaker.CreateTrainingJob")]
    assert len(creates) == len(CELLS)
    sent = {}
    for name, request in zip(CELLS, creates, strict=True):
        sent[name] = (request, uploaded_keys(request["TrainingJobName"], moto_server.url))
    moto_server.reset()
    return sent


@pytest.mark.parametrize("name", list(CELLS))
def test_request_equals_the_sdk_v3_request(sdk_requests, aws, tmp_path, name):
    expected, expected_keys = sdk_requests[name]
    create_buckets()
    namespace = make_files(tmp_path / "files")
    exec(compile(prelude("meshtrain.sagemaker") + CELLS[name], name, "exec"), namespace)
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    request = create.json()
    sdk, ours = normalised(expected), normalised(request)
    assert sorted(ours) == sorted(sdk)
    for field in sdk:
        assert ours[field] == sdk[field], field
    assert uploaded_keys(request["TrainingJobName"]) == expected_keys


def test_the_cells_differ_only_in_the_import_line():
    sdk, ours = prelude("sagemaker"), prelude("meshtrain.sagemaker")
    assert ours == sdk.replace("from sagemaker.", "from meshtrain.sagemaker.")
