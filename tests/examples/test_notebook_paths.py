"""A notebook copied out of the clone still finds the example scripts it runs.

The notebooks' setup cells define `examples_folder()` (examples/notebooks/notebook_cells.py,
FIND_EXAMPLES); it is executed here as the notebooks execute it, from other working directories.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import meshtrain

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "examples" / "notebooks"


def _cells_module():
    spec = importlib.util.spec_from_file_location("notebook_cells", NOTEBOOKS / "notebook_cells.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_setup(cwd: Path, monkeypatch) -> Path:
    """What `EXAMPLES` is after the notebooks' setup code runs in `cwd`."""
    monkeypatch.chdir(cwd)
    namespace = {"Path": Path}
    exec(_cells_module().FIND_EXAMPLES, namespace)  # the notebooks run this same code
    return namespace["EXAMPLES"]


def test_in_the_clone_the_examples_are_beside_the_notebooks(monkeypatch):
    monkeypatch.delenv("MESHTRAIN_EXAMPLES", raising=False)
    assert run_setup(NOTEBOOKS, monkeypatch) == ROOT / "examples"


def test_a_notebook_copied_elsewhere_finds_the_clone_meshtrain_runs_from(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHTRAIN_EXAMPLES", raising=False)
    copied = tmp_path / "my-notebooks"
    copied.mkdir()
    assert run_setup(copied, monkeypatch) == ROOT / "examples"  # meshtrain is installed -e


def test_meshtrain_examples_names_another_folder(tmp_path, monkeypatch):
    own = tmp_path / "examples"
    (own / "quickstart").mkdir(parents=True)
    (own / "quickstart" / "train.py").write_text("")
    monkeypatch.setenv("MESHTRAIN_EXAMPLES", str(own))
    assert run_setup(tmp_path, monkeypatch) == own


def test_without_any_examples_folder_the_error_says_how_to_name_one(tmp_path, monkeypatch):
    monkeypatch.delenv("MESHTRAIN_EXAMPLES", raising=False)
    monkeypatch.setattr(meshtrain, "__file__", str(tmp_path / "a" / "b" / "meshtrain.py"))
    with pytest.raises(FileNotFoundError, match="set MESHTRAIN_EXAMPLES=/path/to/meshtrain/"):
        run_setup(tmp_path, monkeypatch)


def test_no_notebook_reads_a_path_relative_to_its_own_folder():
    for notebook in NOTEBOOKS.glob("*.ipynb"):
        code = "".join("".join(cell["source"]) for cell in json.loads(notebook.read_text())["cells"]
                       if cell["cell_type"] == "code")
        assert "Path.cwd().parent" not in code, notebook.name
        if "EXAMPLES" in code:
            assert "EXAMPLES = examples_folder()" in code, notebook.name
