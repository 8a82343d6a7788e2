"""README says how to get the CPU-only torch build, and its two commands still take it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INSTALL = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"


def test_readme_names_the_cpu_wheel_index_with_the_pinned_version():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"`{CPU_INSTALL}`" in text
    assert "PyTorch's own CPU wheel index" in text
    # the CPU build installed first satisfies the commands' pin (a local version, PEP 440)
    commands = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())
    assert len(commands) == 2 and all("torch==2.13.0 " in command for command in commands)
    pinned = re.search(r"torch==([\d.]+) --index-url", CPU_INSTALL).group(1)
    assert all(f"torch=={pinned} " in command for command in commands)


def test_a_cpu_local_version_satisfies_the_plain_pin():
    from packaging.specifiers import SpecifierSet

    assert "2.13.0+cpu" in SpecifierSet("==2.13.0")
