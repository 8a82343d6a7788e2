"""A new example or notebook fails here until a test runs it (the lists elsewhere are by hand).

Each folder under examples/ must be started by a test (its entry script named in a test file
that runs it); each notebook must be executed by tests/examples/test_notebooks.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUNNERS = [ROOT / "tests" / "examples" / "test_examples.py",
           ROOT / "tests" / "e2e" / "test_quickstart.py",
           ROOT / "tests" / "docker" / "test_docker_example.py"]
ENTRY_SCRIPTS = ("launch.py", "plan.py", "render.py")


def _started(folder: str, script: str, text: str) -> bool:
    return (f'"{folder}/{script}"' in text
            or re.search(rf'"{folder}"\s*/\s*"{re.escape(script)}"', text) is not None)


def test_every_example_folder_is_run_by_a_test():
    text = "\n".join(path.read_text() for path in RUNNERS)
    folders = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "notebooks"
                     and not p.name.startswith((".", "_")))
    assert len(folders) >= 10
    missing = []
    for folder in folders:
        scripts = [s for s in ENTRY_SCRIPTS if (folder / s).exists()]
        assert scripts, f"examples/{folder.name} has none of {ENTRY_SCRIPTS}"
        if not any(_started(folder.name, s, text) for s in scripts):
            missing.append(folder.name)
    assert missing == [], f"examples without a test that runs them: {missing}"


def test_every_notebook_is_executed_by_a_test():
    text = (ROOT / "tests" / "examples" / "test_notebooks.py").read_text()
    notebooks = sorted(p.stem for p in (EXAMPLES / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 5
    assert [n for n in notebooks if f'execute("{n}")' not in text] == []
