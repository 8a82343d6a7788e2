"""An AWS PyTorch image's start, in a real container: the SageMaker training toolkit runs
meshtrain's job without meshtrain installed.

The same job as tests/sdk/backends/sagemaker/test_sagemaker_toolkit_image.py (a notebook's
`PyTorch(framework_version=..., py_version=...)` submitted to moto), but the toolkit's `train`
runs inside a container of the tier's engine, with /opt/ml at its real place: the image is the
tier's scratch image with the toolkit environment (the real sagemaker-training and
sagemaker-pytorch-training packages, torch by a path entry, no meshtrain) mounted at its
path. Host networking lets the toolkit download sourcedir.tar.gz from moto's S3 on 127.0.0.1.
The script's `import meshtrain_runtime` resolves to the copy meshtrain shipped in the archive,
and init()/transform() run a 2-rank HSDP step on gloo.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SAGEMAKER_TESTS = Path(__file__).resolve().parents[1] / "sdk" / "backends" / "sagemaker"
sys.path.insert(0, str(SAGEMAKER_TESTS))

from sagemaker_moto import RecordingMotoServer, point_boto3_at  # noqa: E402
from test_sagemaker_container_entry import lay_out_host  # noqa: E402
from test_sagemaker_toolkit_image import (  # noqa: E402
    IMAGE_DIR,
    check_outputs,
    submit_job,
    toolkit_environment,
    toolkit_image,
)

JOB_BASE = Path("/opt/ml")
PASSED_THROUGH = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                  "AWS_ENDPOINT_URL", "AWS_EC2_METADATA_DISABLED")


@pytest.fixture
def aws(monkeypatch, tmp_path):
    server = RecordingMotoServer()
    server.start()
    point_boto3_at(server, monkeypatch, tmp_path)
    yield server
    server.stop()


def _environment_flags(environment: dict[str, str]) -> list[str]:
    flags = []
    for name, value in environment.items():
        flags += ["--env", f"{name}={value}"]
    return flags


@pytest.mark.multiprocess
def test_toolkit_in_a_container_runs_the_script_through_the_shipped_runtime(
        docker_engine, aws, tmp_path):
    toolkit_image()
    request = submit_job(aws, tmp_path)
    base = tmp_path / "opt" / "ml"
    lay_out_host(request, base, host="localhost")
    mounts = [*docker_engine.volumes, (str(IMAGE_DIR), str(IMAGE_DIR), "rw"),
              (str(base), str(JOB_BASE), "rw")]
    environment = {**toolkit_environment(request),
                   **{name: os.environ[name] for name in PASSED_THROUGH},
                   "PATH": f"{IMAGE_DIR / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    run = ["run", "--rm", "--network", "host", "--shm-size", "256m",
           *[flag for source, target, mode in mounts
             for flag in ("--volume", f"{source}:{target}:{mode}")],
           *_environment_flags(environment), docker_engine.image]
    probe = docker_engine.daemon.docker(*run, str(IMAGE_DIR / "bin" / "python"), "-c",
                                        "import importlib.util as u; "
                                        "print(u.find_spec('meshtrain') is None)")
    assert probe.strip() == "True"  # the image has no meshtrain
    docker_engine.daemon.docker(*run, str(IMAGE_DIR / "bin" / "train"))
    check_outputs(base, job_base=JOB_BASE)
