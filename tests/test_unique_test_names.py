"""Every module of the suite has a basename of its own.

The suite runs in pytest's default `prepend` import mode without packages: each test file's
folder goes on sys.path and its helpers are imported by bare name. Two files named alike
(tests/e2e/test_x.py and tests/runtime/test_x.py) import as one module and the second fails
collection with "import file mismatch" in a whole-suite run, while each passes alone; two
helpers named alike (two `cells.py`) make `from cells import X` take whichever folder came
first on sys.path, so collection of the whole suite failed once while each file passed alone.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# AWS's SMP v2 scripts, kept as published (their own package layout: data/utils.py, utils.py)
VENDORED = TESTS / "runtime" / "compat" / "aws_smp_v2"
SHARED_NAMES = {"conftest.py", "__init__.py"}


def shared_basenames(paths: list[Path]) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        by_name[path.name].append(str(path.relative_to(TESTS)))
    return {name: found for name, found in by_name.items() if len(found) > 1}


def suite_modules() -> list[Path]:
    return [path for path in TESTS.rglob("*.py")
            if path.name not in SHARED_NAMES and VENDORED not in path.parents]


def test_no_two_test_modules_share_a_basename() -> None:
    shared = shared_basenames([path for path in suite_modules() if path.name.startswith("test_")])
    assert not shared, f"rename one of each: {shared}"


def test_no_two_helper_modules_share_a_basename() -> None:
    assert suite_modules(), "no module found"
    shared = shared_basenames(suite_modules())
    assert not shared, f"rename one of each: {shared}"


def test_a_shared_helper_name_is_found() -> None:
    paths = [TESTS / "sdk" / "a" / "cells.py", TESTS / "sdk" / "b" / "cells.py",
             TESTS / "sdk" / "b" / "other.py"]
    assert shared_basenames(paths) == {"cells.py": ["sdk/a/cells.py", "sdk/b/cells.py"]}
