"""Every test module has a basename of its own.

The suite runs in pytest's default `prepend` import mode without packages, so two files named
alike (tests/e2e/test_x.py and tests/runtime/test_x.py) import as one module and the second
fails collection with "import file mismatch" in a whole-suite run, while each passes alone.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        by_name[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"rename one of each: {shared}"
