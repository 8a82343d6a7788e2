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
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # xdist hooks: unknown without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedResourceScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _scope_of_nodeid(config, nodeid)

    return SharedResourceScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return max(1, min(os.cpu_count() or 1, MOST_WORKERS))
