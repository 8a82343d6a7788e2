"""The example notebooks: stripped in git, up to date with their cells, and they run.

Each notebook is executed headless with nbclient in a fresh kernel started in its own folder
(as Jupyter does). A cell that raises, including an `assert` cell on the notebook's key result,
fails the test with the cell's traceback; the executed notebook must hold its plots (image/png).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from ci_guards import import_or_skip
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from sagemaker_moto import ROLE

from meshtrain.backends.sagemaker.metrics import metric_definitions

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "examples" / "notebooks"
NAMES = ["quickstart", "planning", "sagemaker", "resume_other_layout", "stop_and_resume",
         "llama_pipeline", "fault_tolerance", "sagemaker_v3"]
# how many plots each notebook draws (one per figure)
PLOTS = {"quickstart": 1, "planning": 3, "sagemaker": 1, "resume_other_layout": 1,
         "stop_and_resume": 1, "llama_pipeline": 2, "fault_tolerance": 1, "sagemaker_v3": 1}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """MESHTRAIN_HOME for the notebook's jobs: the kernel inherits this process's environment."""
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the resume notebook's checkpoint directories
    return tmp_path


def execute(name: str) -> nbformat.NotebookNode:
    """Run every cell of `name`.ipynb in a fresh kernel started in the notebooks' folder."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"{name}.ipynb: a cell failed:\n{error}", pytrace=False)
    return notebook


def images(notebook: nbformat.NotebookNode) -> int:
    return sum("image/png" in output.get("data", {})
               for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.outputs)


def check_ran(notebook: nbformat.NotebookNode, name: str) -> None:
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "a cell did not run"
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors
    assert images(notebook) == PLOTS[name]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_in_git_has_no_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


def test_notebooks_match_their_cells():
    """The .ipynb files are what make_notebooks.py writes from notebook_cells*.py."""
    run = subprocess.run([sys.executable, str(NOTEBOOKS / "make_notebooks.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_planning_notebook(home):
    check_ran(execute("planning"), "planning")


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_quickstart_notebook(home):
    check_ran(execute("quickstart"), "quickstart")
    assert len(list((home / "jobs").iterdir())) == 1  # the notebook's own job


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_sagemaker_notebook_against_moto(aws, home, monkeypatch):
    """The `aws` fixture points AWS_ENDPOINT_URL at moto; the notebook's SageMaker job is the
    request moto received, its local try-out a real local job."""
    monkeypatch.setenv("MESHTRAIN_IMAGE_URI", "meshtrain:latest")
    monkeypatch.setenv("SAGEMAKER_ROLE", ROLE)
    check_ran(execute("sagemaker"), "sagemaker")
    (request,) = [r.json() for r in aws.find("SageMaker.CreateTrainingJob")]
    assert request["ResourceConfig"] == {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2,
                                         "VolumeSizeInGB": 30}
    assert request["AlgorithmSpecification"]["TrainingImage"] == "meshtrain:latest"
    # the notebook's metric definition as sent, beside meshtrain's standard ones (moto's
    # describe replaces them all with one of its own)
    sent = request["AlgorithmSpecification"]["MetricDefinitions"]
    assert [d for d in sent if d["Name"] == "train:loss"] == metric_definitions("train:loss")
    assert request["HyperParameters"]["mp_parameters"] == '{"hybrid_shard_degree": 4}'


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_sagemaker_v3_notebook_against_moto(aws, home, monkeypatch):
    """SDK v3 ModelTrainer cells under meshtrain's import line: a real local job, then the
    SageMaker request moto received (SDK v3's shape, meshtrain's drivers)."""
    monkeypatch.setenv("MESHTRAIN_IMAGE_URI", "meshtrain:latest")
    monkeypatch.setenv("SAGEMAKER_ROLE", ROLE)
    check_ran(execute("sagemaker_v3"), "sagemaker_v3")
    (request,) = [r.json() for r in aws.find("SageMaker.CreateTrainingJob")]
    assert request["AlgorithmSpecification"]["ContainerEntrypoint"] == ["/bin/bash"]
    assert request["OutputDataConfig"]["S3OutputPath"].endswith("/meshtrain-v3-notebook")
    assert len(list((home / "jobs").iterdir())) == 1  # the local try-out


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_resume_notebook(home):
    notebook = execute("resume_other_layout")
    check_ran(notebook, "resume_other_layout")
    assert len(list((home / "jobs").iterdir())) == 3
    printed = "".join(output.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for output in cell.outputs)
    assert "['step_00000006']" in printed  # job 1 saved step 6 in the shared folder
    assert list(home.glob("meshtrain-ckpt-*")) == []  # the last cell removed the checkpoints


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_stop_and_resume_notebook(home):
    check_ran(execute("stop_and_resume"), "stop_and_resume")
    statuses = sorted(json.loads((job / "status.json").read_text())["TrainingJobStatus"]
                      for job in (home / "jobs").iterdir())
    assert statuses == ["Completed", "Completed", "Stopped"]
    assert list(home.glob("meshtrain-ckpt-*")) == []  # the last cell removed the checkpoints


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_llama_pipeline_notebook(home):
    notebook = execute("llama_pipeline")
    check_ran(notebook, "llama_pipeline")  # the loss curve and the timeline
    assert len(list((home / "jobs").iterdir())) == 1
    printed = "".join(output.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for output in cell.outputs)
    assert "1F1B order on every rank; checkpoint step_00000008 complete" in printed


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_fault_tolerance_notebook(home):
    import_or_skip("torchft")  # meshtrain[ft]: missing, a skip here and a failure under CI
    notebook = execute("fault_tolerance")
    check_ran(notebook, "fault_tolerance")  # its assert cell: Completed, group 1 rejoined
    printed = "".join(output.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for output in cell.outputs)
    assert "replica group 1 (algo-2) failed" in printed and "healed from a peer" in printed
