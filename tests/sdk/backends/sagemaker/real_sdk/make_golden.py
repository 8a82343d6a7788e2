"""Write golden CreateTrainingJob requests with the real SageMaker Python SDK.

Each launcher cell of cells.py is run through ``sagemaker.pytorch.PyTorch(...).fit(...)``
against moto serving HTTP on 127.0.0.1 (the tests' RecordingMotoServer); the request body moto
received is written to ``golden/sdk/<cell>.json`` with the SDK version. Run it in an environment
with the test-only extra and the dev tools:

    pip install -e '.[dev]'
    python tests/sdk/backends/sagemaker/real_sdk/make_golden.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden" / "sdk"
sys.path[:0] = [str(HERE), str(HERE.parent)]

from cells import CELLS, build_inputs, create_buckets  # noqa: E402
from sagemaker_moto import REGION, RecordingMotoServer  # noqa: E402


def _environment(url: str, scratch: Path) -> None:
    """moto's endpoint, fake credentials, and the SDK's TelemetryOptOut default set."""
    config = scratch / "sagemaker-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      TelemetryOptOut: true\n")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        os.environ.pop(name, None)
    os.environ.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": url,
        "AWS_EC2_METADATA_DISABLED": "true", "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
    })


def _run_cell(name: str, cell: dict, source: Path, server: RecordingMotoServer) -> dict:
    import boto3
    import sagemaker
    from sagemaker import inputs as sdk_inputs
    from sagemaker.pytorch import PyTorch

    server.reset()
    create_buckets()
    session = sagemaker.Session(boto_session=boto3.Session(region_name=REGION))
    estimator = PyTorch(source_dir=str(source), sagemaker_session=session, **cell["arguments"])
    estimator.fit(build_inputs(cell["inputs"], sdk_inputs), job_name=name, wait=False,
                  logs=False)
    (create,) = server.find("SageMaker.CreateTrainingJob")
    return create.json()


def main() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    server = RecordingMotoServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            _environment(server.url, Path(scratch))
            source = Path(scratch) / "src"
            source.mkdir()
            (source / "train.py").write_text("print('train')\n")
            version = metadata.version("sagemaker")
            for name, cell in CELLS.items():
                request = _run_cell(name, cell, source, server)
                document = {"_how": f"written by real_sdk/make_golden.py with SageMaker Python "
                                    f"SDK {version} against moto", **request}
                (GOLDEN / f"{name}.json").write_text(json.dumps(document, indent=1,
                                                                sort_keys=True) + "\n")
                print(f"{name}: {request['AlgorithmSpecification']['TrainingImage']}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
