"""How the suite shares a machine with itself under pytest-xdist (`pytest -n auto --dist
loadfile`, README's test command).

With ``--dist loadfile`` each test file runs whole on one worker, so a module-scoped fixture's
launch (several cases sharing one torchrun) still runs once. Files that share a machine-wide
resource run on one worker together: the docker tier (one private dockerd per worker and
meshtrain's image built in it, minutes; two engines on one machine also collide on their
networks), the SageMaker toolkit environment cached under ~/.cache (built and installed into
by its two tests), and the end-to-end fault-tolerance jobs, whose timing bounds hold for one
such job on the cores at a time. xdist's own ``loadgroup`` would say this with markers, but
with pytest 9 its workers no longer rename node ids, so the grouping is done here, in the
scheduler.

Workers take the longest scopes first (tests/scope_order.py, costs in scope_seconds.json): in
alphabetical order the long Slurm tier came last and ran alone at the end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from scope_order import SECONDS_FILE, order_by_cost, read_costs, scope_seconds

# What CI enforces about skips and tiers (CI=true): tests/ci_guards.py, docs/testing.md.
pytest_plugins = ["ci_guards"]

TESTS = Path(__file__).resolve().parent
SHARED_RESOURCES = {
    TESTS / "docker": "docker tier",
    TESTS / "sdk" / "backends" / "sagemaker" / "test_sagemaker_toolkit_image.py": "docker tier",
    TESTS / "slurm": "slurm tier",  # one cluster per worker: the tier's files on one worker
    # their bounds (a rejoin within 30 s, group 0 never 5 s without a step) are stated at a
    # load <= 4: one fault-tolerant 2 x 2 job at a time, never two of them side by side
    **{TESTS / "e2e" / name: "fault-tolerance jobs" for name in (
        "test_fault_tolerance_job.py", "test_data_fault_tolerance.py",
        "test_fault_tolerance_long.py")},
}
MOST_WORKERS = 4  # a worker runs jobs of up to 8 ranks; more workers only queue on the cores


def scope_of(path: Path) -> str:
    """The unit a worker runs whole: a shared resource's files together, else one file (its
    path from the repository's root, the same on every machine)."""
    for owner, scope in SHARED_RESOURCES.items():
        if path == owner or owner in path.parents:
            return scope
    return path.relative_to(TESTS.parent).as_posix()


def _scope_of_nodeid(config: pytest.Config, nodeid: str) -> str:
    return scope_of(config.rootpath / nodeid.split("::", 1)[0])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-scope-seconds", action="store_true",
                     help=f"write each scope's wall seconds in this run to {SECONDS_FILE.name}")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_scope_seconds"):
        config.pluginmanager.register(_ScopeSecondsRecorder(config), "scope-seconds-recorder")


class _ScopeSecondsRecorder:
    """On the controller (or a run without xdist): every phase's duration, per scope."""

    def __init__(self, config: pytest.Config) -> None:
        self.config, self.reports = config, []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.append((report.nodeid, report.duration))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):  # a worker: the controller records
            return
        seconds = scope_seconds(self.reports, lambda n: _scope_of_nodeid(self.config, n))
        SECONDS_FILE.write_text(json.dumps(seconds, indent=1) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the longest scopes first (the controller takes the workers' order)."""
    if hasattr(config, "workerinput") and config.getvalue("dist") == "loadfile":
        items[:] = order_by_cost(items, lambda item: scope_of(Path(item.path)), read_costs())


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # xdist hooks: unknown without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # keep the cost order of the workers' collection

    class SharedResourceScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of_nodeid(config, nodeid)

    return SharedResourceScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(os.cpu_count() or 1, MOST_WORKERS))
