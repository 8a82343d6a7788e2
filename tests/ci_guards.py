"""What CI enforces about the tests that did not run (docs/testing.md, "What CI enforces").

A pytest plugin (``pytest_plugins`` in tests/conftest.py). Outside CI it only prints. With the
environment variable ``CI=true`` the run fails when

- a test was skipped (or xfailed) and is not a `gpu`-marked test skipped because it "needs a
  GPU" (the one skip a CPU machine may have); a module skipped whole must say "needs a GPU";
- a tier ran fewer tests than its floor: `FLOOR_FRACTION` (95 %) of the count last recorded in
  tests/tier_floors.json, rounded up. A marker's tests deselected or never collected count as
  skipped too. The counts are kept per ``-m`` expression (README's command runs ``-m 'not
  serial'`` and then ``-m serial``) and apply when the run is the whole suite (no paths named on
  the command line). ``python3 tests/ci_guards.py --record`` records them from a
  ``--collect-only`` of each expression (`gpu` tests left out: on a CPU machine they skip), so
  the floors follow the suite: record after adding or removing tests on purpose;

and the skip summary (``-rs``) is printed. Under pytest-xdist the controller receives every
report and decides; the workers only run tests.

Tests call `missing_component` and `import_or_skip` where a real part is absent: a skip with its
reason on a developer's machine, a failure under CI.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

GPU_MARKER = "gpu"
GPU_REASON = "needs a GPU"
FLOORS_FILE = Path("tests") / "tier_floors.json"
FLOOR_FRACTION = 0.95
"""A tier fails CI below this share of its recorded count (rounded up: a tier of one test must
keep it)."""
TIER_MARKERS = ("multiprocess", "e2e", "docker", "slurm", "serial")
README_SELECTIONS = ("not serial", "serial")
RECORD_ENV = "MESHTRAIN_RECORD_TIER_COUNTS"
"""Set to a file path: a --collect-only run writes its per-tier counts there (`record`)."""


def in_ci() -> bool:
    """CI=true (GitHub's and most CI systems' convention; .ci/run sets it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing_component(reason: str) -> NoReturn:
    """A real component the test needs is absent: skip with `reason`, or fail under CI."""
    __tracebackhide__ = True
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing component fails the run)", pytrace=False)
    pytest.skip(reason)


def import_or_skip(name: str) -> ModuleType:
    """`name` imported; missing_component only when `name` itself (or its package) is not
    installed. A module that is there but fails to import raises: a broken install is an error,
    never read as missing."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or not (name == error.name or name.startswith(error.name + ".")):
            raise
        missing_component(f"{name} is not installed ({error})")


def expected_skip(markers: set[str] | None, reason: str) -> bool:
    """The one skip CI accepts: a `gpu` test (or a module, markers None) that needs a GPU."""
    gpu = markers is None or GPU_MARKER in markers
    return gpu and GPU_REASON in reason and not reason.startswith("xfail")


def floors_of(counts: dict[str, int], fraction: float = FLOOR_FRACTION) -> dict[str, int]:
    """The least number of tests each tier must run: `fraction` of its recorded count."""
    return {marker: math.ceil(count * fraction - 1e-9) for marker, count in counts.items()}


def tier_counts(markers_per_test: Iterable[set[str]]) -> dict[str, int]:
    """How many tests of each tier a selection holds ("tests": all), `gpu` tests left out."""
    kept = [markers for markers in markers_per_test if GPU_MARKER not in markers]
    counts = {"tests": len(kept)}
    for marker in TIER_MARKERS:
        count = sum(marker in markers for markers in kept)
        if count:
            counts[marker] = count
    return counts


def floor_problems(floors: dict[str, int], ran: dict[str, set[str]]) -> list[str]:
    """The tiers below their floor: `floors` maps a marker (or "tests": all) to a least count of
    tests that ran; `ran` maps each test that ran to its markers."""
    problems = []
    for marker, floor in sorted(floors.items()):
        count = len(ran) if marker == "tests" else sum(marker in m for m in ran.values())
        if count < floor:
            problems.append(f"tier {marker!r}: {count} tests ran, the floor is {floor}")
    return problems


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_configure(config: pytest.Config) -> None:
    # xdist workers only run tests: the controller receives their reports and decides
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(CiGuard(config), "meshtrain-ci-guard")


class CiGuard:
    """One run's record: the tests whose body ran (with their markers), unexpected skips."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.ran: dict[str, set[str]] = {}
        self.unexpected: dict[str, str] = {}
        self.problems: list[str] = []
        chars = config.option.reportchars or ""
        if in_ci() and not any(c in chars for c in "sSaA"):
            config.option.reportchars = chars + "s"  # the skip summary

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        markers = {name for name, value in report.keywords.items() if value}
        if report.skipped:
            if not expected_skip(markers, _reason(report)):
                self.unexpected[report.nodeid] = _reason(report)
        elif report.when == "call":
            self.ran[report.nodeid] = markers

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        target = os.environ.get(RECORD_ENV)
        if target:  # `record`: this selection's tiers, as collected
            counts = tier_counts({mark.name for mark in item.iter_markers()}
                                 for item in session.items)
            Path(target).write_text(json.dumps(counts))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and not expected_skip(None, _reason(report)):
            self.unexpected[report.nodeid] = _reason(report)

    def whole_suite(self) -> bool:
        """No paths named: the run is the testpaths (the floors describe those); a collection
        without a run (--collect-only) has no floors to meet."""
        return (self.config.args_source == pytest.Config.ArgsSource.TESTPATHS
                and not self.config.option.collectonly)

    def check_floors(self) -> None:
        path = self.config.rootpath / FLOORS_FILE
        expression = " ".join((self.config.option.markexpr or "").split())
        recorded = json.loads(path.read_text()) if path.exists() else {}
        selections = recorded.get("selections", {})
        if expression not in selections:
            self.problems.append(f"no tier counts for -m {expression!r} in {FLOORS_FILE}: "
                                 "record them (python3 tests/ci_guards.py --record)")
            return
        fraction = recorded.get("floor_fraction", FLOOR_FRACTION)
        self.problems.extend(
            f"{problem} ({fraction:.0%} of the count recorded in {FLOORS_FILE}; a suite that "
            "shrank on purpose: python3 tests/ci_guards.py --record)"
            for problem in floor_problems(floors_of(selections[expression], fraction), self.ran))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not in_ci():
            return
        self.problems.extend(f"unexpected skip: {nodeid}: {reason}"
                             for nodeid, reason in sorted(self.unexpected.items()))
        if self.whole_suite():
            self.check_floors()
        ok = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
              pytest.ExitCode.NO_TESTS_COLLECTED)
        if self.problems and exitstatus in ok:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not in_ci():
            return
        terminalreporter.section("CI guards (CI=true)")
        for problem in self.problems:
            terminalreporter.write_line(f"FAILED CI guard: {problem}", red=True)
        if not self.problems:
            scope = "" if self.whole_suite() else " (paths named or --collect-only: no floors)"
            terminalreporter.write_line(
                f"CI guards passed: no unexpected skip; {len(self.ran)} tests ran{scope}")


def collected_counts(root: Path, expression: str) -> dict[str, int]:
    """The tiers of `-m expression`, from a --collect-only of the suite under `root`."""
    with tempfile.TemporaryDirectory() as scratch:
        target = Path(scratch) / "counts.json"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
             "-m", expression], cwd=root, env={**os.environ, RECORD_ENV: str(target)},
            capture_output=True, text=True, check=False)
        if done.returncode not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) or (
                not target.exists()):
            raise SystemExit(f"collecting -m {expression!r} failed (exit {done.returncode}):\n"
                             f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        return json.loads(target.read_text())


def record(root: Path, selections: Sequence[str] = README_SELECTIONS) -> dict:
    """Write each selection's tier counts into `root`/tests/tier_floors.json; return the file."""
    path = root / FLOORS_FILE
    recorded = {
        "about": "Under CI=true (tests/ci_guards.py): per -m expression of README's test "
                 "command, how many tests of each marker the suite held when recorded ('tests': "
                 "all; gpu tests left out, they skip on CPU). A whole-suite run fails when a "
                 "tier runs fewer than floor_fraction of its count (rounded up): deselected, "
                 "never collected and skipped tests do not count. Written by `python3 "
                 "tests/ci_guards.py --record`; record again when tests are added or removed.",
        "floor_fraction": FLOOR_FRACTION,
        "recorded": time.strftime("%Y-%m-%d"),
        "selections": {expression: collected_counts(root, expression)
                       for expression in selections},
    }
    path.write_text(json.dumps(recorded, indent=2) + "\n")
    return recorded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CI's tier counts (tests/tier_floors.json).")
    parser.add_argument("--record", action="store_true", required=True,
                        help="collect README's selections and write their tier counts")
    parser.parse_args(argv)
    recorded = record(Path(__file__).resolve().parents[1])
    for expression, counts in recorded["selections"].items():
        print(f"-m {expression!r}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
