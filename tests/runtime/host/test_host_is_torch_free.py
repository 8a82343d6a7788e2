"""The host side runs before (and outside) torch: every host/ module imports with torch blocked,
and so does every client module (the client never imports torch)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import importlib, pkgutil, sys
    sys.modules["torch"] = None  # any `import torch` now raises ImportError
    package = importlib.import_module(sys.argv[1])
    names = [package.__name__] + [info.name for info in pkgutil.walk_packages(
        package.__path__, package.__name__ + ".") if not info.name.endswith("__main__")]
    for name in names:
        importlib.import_module(name)
    print(len(names))
""")


@pytest.mark.parametrize("package, at_least", [("meshtrain_runtime.host", 7), ("meshtrain", 40)])
def test_every_module_imports_without_torch(package, at_least):
    done = subprocess.run([sys.executable, "-c", PROBE, package], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip()) >= at_least


def test_the_probe_fails_when_a_module_needs_torch():
    done = subprocess.run([sys.executable, "-c", PROBE, "meshtrain_runtime.parallel"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "torch" in done.stderr
