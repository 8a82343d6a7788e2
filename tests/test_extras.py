"""Issue 35: `pip install 'meshtrain[notebooks]'` is enough for the notebooks and pulls none of
the dev extra's heavy test tools (the dev extra took 6 min 23 s to install)."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("sagemaker", "moto", "kubernetes", "tensorboard", "torchao")
# import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml"}


def extra(name: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"][name]


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", item, maxsplit=1)[0].lower() for item in requirements}


def notebook_imports() -> set[str]:
    """Top-level modules the notebooks' code cells import, stdlib and meshtrain left out."""
    found: set[str] = set()
    for notebook in (ROOT / "examples" / "notebooks").glob("*.ipynb"):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            tree = ast.parse("".join(cell["source"]))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return {name for name in found
            if name not in sys.stdlib_module_names and name != "meshtrain"}


def test_the_notebooks_extra_pulls_none_of_the_heavy_test_tools():
    names = requirement_names(extra("notebooks"))
    assert not [name for name in names if name.startswith(HEAVY)], names
    # no dev extra through a self-reference
    assert not [item for item in extra("notebooks") if "meshtrain[" in item]


def test_the_notebooks_extra_covers_what_the_notebooks_and_their_jobs_import():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    available = requirement_names(extra("notebooks")) | requirement_names(project["dependencies"])
    imported = notebook_imports()
    assert imported  # the notebooks were read
    missing = {name for name in imported if DISTRIBUTION.get(name, name) not in available}
    assert not missing, missing
    # the jobs the notebooks run train Hugging Face models with torch; Jupyter needs a kernel
    assert {"torch", "transformers", "ipykernel", "nbclient"} <= available


def test_the_docs_tell_notebook_users_to_install_the_extra():
    assert "pip install 'meshtrain[notebooks]'" in (ROOT / "docs" / "examples.md").read_text()
