"""meshtrain's CreateTrainingJob equals the real SageMaker Python SDK's, launcher cell by cell.

golden/sdk/*.json were written by real_sdk/make_golden.py with SageMaker Python SDK 2.257.7
(test-only, in the ``dev`` extra) against moto; here the same cells (real_sdk/cells.py)
go through `meshtrain.sagemaker.PyTorch` against moto over HTTP, and the request moto received
must equal the SDK's field by field: TrainingImage from the versions, FileSystemDataSource, the
TrainingInput options, hyperparameters, checkpoint, VPC, debugger and profiler settings. The one
intended difference: meshtrain appends the standard metrics' MetricDefinitions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from meshtrain import sagemaker as drop_in
from meshtrain.backends.sagemaker.metrics import with_standard_definitions

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "real_sdk"))
from cells import CELLS, build_inputs, create_buckets  # noqa: E402
from test_sagemaker_submit import assert_fields_match  # noqa: E402

GOLDEN = HERE / "golden" / "sdk"


def test_every_cell_has_a_golden_file_from_the_pinned_sdk():
    files = sorted(p.stem for p in GOLDEN.glob("*.json"))
    assert files == sorted(CELLS)
    for name in files:
        assert "SageMaker Python SDK 2.257.7" in json.loads((GOLDEN / f"{name}.json").read_text())[
            "_how"]


@pytest.mark.parametrize("name", sorted(CELLS))
def test_cell_request_equals_the_sdk_request(aws, tmp_path, name):
    cell = CELLS[name]
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    expected.pop("_how")
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('train')\n")
    create_buckets()
    estimator = drop_in.PyTorch(source_dir=str(source), **cell["arguments"])
    estimator.fit(build_inputs(cell["inputs"], drop_in), job_name=name, wait=False)
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    request = create.json()
    user = expected["AlgorithmSpecification"].get("MetricDefinitions", [])
    sent = request["AlgorithmSpecification"].pop("MetricDefinitions")
    assert sent == with_standard_definitions(user)
    if user:
        request["AlgorithmSpecification"]["MetricDefinitions"] = sent[: len(user)]
    assert_fields_match(request, expected)


GRID = {"distribution": [None, "FullyReplicated", "ShardedByS3Key"],
        "compression": [None, "Gzip"], "content_type": [None, "text/csv"],
        "record_wrapping": [None, "RecordIO"], "input_mode": [None, "File", "Pipe", "FastFile"]}
KINDS = ({}, {"s3_data_type": "ManifestFile"}, {"target_attribute_name": "y"},
         {"s3_data_type": "AugmentedManifestFile", "attribute_names": ["source-ref"]})


def test_channel_objects_build_the_sdks_config():
    """Only with the test-only extra installed (the real SDK in this environment): every
    combination of TrainingInput options, and FileSystemInput, give the SDK's config."""
    import itertools

    sdk = pytest.importorskip("sagemaker.inputs")
    for values in itertools.product(*GRID.values()):
        for kind in KINDS:
            arguments = {**dict(zip(GRID, values, strict=True)), **kind}
            assert (drop_in.TrainingInput("s3://b/x", **arguments).config
                    == sdk.TrainingInput("s3://b/x", **arguments).config), arguments
    shuffled = {"shuffle_config": drop_in.ShuffleConfig(3)}
    assert drop_in.TrainingInput("s3://b/x", **shuffled).config == sdk.TrainingInput(
        "s3://b/x", shuffle_config=sdk.ShuffleConfig(3)).config
    for system in ("EFS", "FSxLustre"):
        arguments = ("fs-0123456789abcdef0", system, "/data", "rw", "text/csv")
        assert drop_in.FileSystemInput(*arguments).config == sdk.FileSystemInput(
            *arguments).config
