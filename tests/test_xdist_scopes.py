"""tests/conftest.py's xdist scopes: what must share one worker does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# by path: several test folders have a conftest module, and sys.path order decides which
_spec = importlib.util.spec_from_file_location("tests_root_conftest",
                                               Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
TESTS, scope_of = _conftest.TESTS, _conftest.scope_of


def test_the_docker_tier_and_the_toolkit_environment_share_one_worker():
    toolkit = TESTS / "sdk" / "backends" / "sagemaker" / "test_sagemaker_toolkit_image.py"
    docker_files = sorted((TESTS / "docker").glob("test_*.py"))
    assert len(docker_files) >= 2
    assert {scope_of(path) for path in [*docker_files, toolkit]} == {"docker tier"}


def test_every_other_file_is_its_own_scope():
    others = [TESTS / "sdk" / "test_targets.py", TESTS / "e2e" / "test_local_jobs.py"]
    assert [scope_of(path) for path in others] == ["tests/sdk/test_targets.py",
                                                 "tests/e2e/test_local_jobs.py"]


def test_the_fault_tolerance_jobs_never_run_beside_each_other():
    e2e = TESTS / "e2e"
    files = [e2e / "test_fault_tolerance_job.py", e2e / "test_data_fault_tolerance.py",
             e2e / "test_fault_tolerance_long.py"]
    assert all(path.exists() for path in files)
    assert {scope_of(path) for path in files} == {"fault-tolerance jobs"}
    assert scope_of(e2e / "test_local_jobs.py") == "tests/e2e/test_local_jobs.py"
