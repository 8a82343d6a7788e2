"""README's two set-up commands exist and CI runs the test command verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", readme)


def test_readme_has_exactly_two_commands():
    commands = _commands()
    assert len(commands) == 2, commands
    assert "examples/quickstart/launch.py" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_both_readme_commands_verbatim_in_fresh_venvs():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    created = {line.split()[-1] for line in lines if line.startswith("python3 -m venv")}
    used = []
    for command in _commands():
        assert command in lines, f"not in .ci/run verbatim: {command}"
        before = lines[: lines.index(command)]
        activations = [line for line in before if line.startswith(". ") and "/bin/activate" in line]
        assert activations, f"{command} runs outside a virtual environment"
        venv = activations[-1].split()[1].strip('"').removesuffix("/bin/activate")
        assert venv in {c.strip('"') for c in created}, f"{venv} is not made fresh by .ci/run"
        used.append(venv)
    assert len(set(used)) == len(used), f"the two commands share a virtual environment: {used}"
