"""Write the example notebooks (.ipynb, no outputs) from the cells below, with nbformat.

    python examples/notebooks/make_notebooks.py          # rewrite them
    python examples/notebooks/make_notebooks.py --check  # exit 1 if a notebook is out of date

The notebooks are kept as code here so that a review reads Python, not JSON, and git never holds
outputs; tests/examples/test_notebooks.py executes each one headless and checks they match.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

# sibling modules: running this file puts its directory on sys.path
from notebook_cells import QUICKSTART, RESUME
from notebook_cells_cloud import PLANNING, SAGEMAKER
from notebook_cells_ft import FAULT_TOLERANCE
from notebook_cells_pipeline import PIPELINE
from notebook_cells_sagemaker_v3 import SAGEMAKER_V3
from notebook_cells_stop import STOP

HERE = Path(__file__).resolve().parent
NOTEBOOKS = {"quickstart": QUICKSTART, "planning": PLANNING, "sagemaker": SAGEMAKER,
             "resume_other_layout": RESUME, "stop_and_resume": STOP,
             "llama_pipeline": PIPELINE, "fault_tolerance": FAULT_TOLERANCE,
             "sagemaker_v3": SAGEMAKER_V3}
KERNEL = {"display_name": "Python 3", "language": "python", "name": "python3"}


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook of ("md" | "code", source) cells, with fixed ids so files are reproducible."""
    notebook = new_notebook(metadata={"kernelspec": KERNEL,
                                      "language_info": {"name": "python"}})
    for index, (kind, source) in enumerate(cells):
        make = new_markdown_cell if kind == "md" else new_code_cell
        cell = make(source.strip("\n"))
        cell["id"] = f"cell-{index:02d}"
        notebook.cells.append(cell)
    return notebook


def render(cells: list[tuple[str, str]]) -> str:
    return nbformat.writes(build(cells)) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / f"{name}.ipynb"
        text = render(cells)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run {Path(__file__).name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
