"""CI's guards (tests/ci_guards.py) fail the runs they must fail: each case runs pytest in a
subprocess (pytester) and asserts the inner run's exit status, outcomes and the guard's lines.

(a) a docker tier whose daemon cannot start fails under CI=true, through tests/docker/conftest.py
    itself (a fake dockerd that exits at once, first on PATH); (b) an unexpected skip fails the
    run, with and without xdist; (c) a `gpu` test skipped because it needs a GPU does not;
(d) a tier under its floor (95 % of its recorded count), or a selection without counts, fails,
and `--record` writes the counts a --collect-only finds. Each inner run is also made without
CI=true (or with the floor met) to show that the guard, not the test, fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from ci_guards import (
    expected_skip,
    floor_problems,
    floors_of,
    import_or_skip,
    missing_component,
    record,
    tier_counts,
)

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# one docker test: the tier's session fixture starts the engine before any test body
DOCKER_TEST = ("tests/docker/test_docker_jobs.py"
               "::test_stop_mid_job_removes_its_containers_and_network")
CRD_TEST = "tests/sdk/backends/kubernetes/test_render.py::test_trainjob_validates"
INI = """
[pytest]
testpaths = tests
addopts = -ra --strict-markers -p ci_guards -p no:cacheprovider
markers =
    gpu: needs a GPU
    e2e: a whole job
    serial: alone
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project of its own whose pytest loads the guard from this checkout."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), path]) if path else str(TESTS))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    pytester.makeini(INI)
    return pytester


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool,
         *args: str) -> pytest.RunResult:
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    return pytester.runpytest_subprocess(*args, timeout=120)


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def broken_dockerd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH whose dockerd prints a line to its log and exits 1 (an installed, broken engine)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    _executable(fake / "dockerd",
                "#!/bin/sh\necho 'fake dockerd: simulated broken engine'\nexit 1\n")
    _executable(fake / "docker", "#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    return fake


@pytest.mark.parametrize("ci", [True, False])
def test_a_docker_daemon_that_cannot_start_is_an_error_with_its_log(
        pytester, monkeypatch, broken_dockerd, ci):
    """The real tier (tests/docker/conftest.py's docker_engine): an engine that is there but does
    not start errors, with the daemon's log, in CI and out of it (it used to be a skip)."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    result = _run(pytester, monkeypatch, ci, "--rootdir", str(ROOT), "-p", "no:xdist",
                  "-p", "no:cacheprovider", str(ROOT / DOCKER_TEST))
    result.assert_outcomes(errors=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*the engine could not start*",
                                 "*fake dockerd: simulated broken engine*"])


@pytest.mark.parametrize("ci", [True, False])
def test_a_missing_docker_engine_fails_under_ci_and_skips_with_its_reason_elsewhere(
        pytester, monkeypatch, tmp_path, ci):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    result = _run(pytester, monkeypatch, ci, "--rootdir", str(ROOT), "-p", "no:xdist",
                  "-p", "no:cacheprovider", str(ROOT / DOCKER_TEST))
    result.stdout.fnmatch_lines(["*docker tier: no dockerd on PATH*"])
    if ci:
        result.assert_outcomes(errors=1)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
    else:
        result.assert_outcomes(skipped=1)
        assert result.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("ci", [True, False])
def test_absent_crd_schemas_fail_under_ci_and_skip_with_their_reason_elsewhere(
        pytester, monkeypatch, tmp_path, ci):
    """../shared/schemas is read where it is (never copied in, shared/README.md); where it is
    absent the Kubernetes validation says so: a skip on a developer's machine, a CI failure."""
    monkeypatch.setenv("MESHTRAIN_SHARED_SCHEMAS", str(tmp_path / "no-schemas"))
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    result = _run(pytester, monkeypatch, ci, "--rootdir", str(ROOT), "-p", "no:xdist",
                  "-p", "no:cacheprovider", str(ROOT / CRD_TEST))
    result.stdout.fnmatch_lines(["*the Kubeflow CRD schemas are not at*no-schemas*"])
    if ci:
        result.assert_outcomes(failed=1)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
    else:
        result.assert_outcomes(skipped=1)
        assert result.ret == pytest.ExitCode.OK


@pytest.mark.multiprocess  # the rendezvous test's agents in network namespaces
def test_an_etcd_that_does_not_start_fails_with_its_log(pytester, monkeypatch, tmp_path):
    """The real elastic rendezvous test with an etcd that exits at once (first on PATH): an
    error naming etcd and carrying its log, not a skip."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing_component("needs root and `ip` for the rendezvous test's network namespaces")
    fake = tmp_path / "fakebin"
    fake.mkdir()
    _executable(fake / "etcd", "#!/bin/sh\necho 'fake etcd: simulated bind failure'\nexit 1\n")
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    result = _run(pytester, monkeypatch, True, "--rootdir", str(ROOT), "-p", "no:xdist",
                  "-p", "no:cacheprovider", str(ROOT / "tests/e2e/test_elastic_rendezvous.py"))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*etcd did not become healthy (exit 1); its log:*",
                                 "*fake etcd: simulated bind failure*"])


SKIPS = """
import pytest

def test_runs():
    pass

def test_skips_without_a_reason_ci_accepts():
    pytest.skip("the frobnicator is not installed")
"""


@pytest.mark.parametrize("workers", [
    ["-p", "no:xdist"],
    pytest.param(["-n", "2"], marks=pytest.mark.multiprocess),  # xdist's worker processes
], ids=["plain", "xdist"])
def test_b_an_unexpected_skip_fails_the_run_under_ci(inner, monkeypatch, workers):
    inner.makepyfile(test_skips=SKIPS)
    result = _run(inner, monkeypatch, True, *workers, "test_skips.py")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["SKIPPED * the frobnicator is not installed"])  # -rs
    result.stdout.fnmatch_lines([
        "FAILED CI guard: unexpected skip: test_skips.py::test_skips_without_a_reason_ci_accepts:"
        " the frobnicator is not installed"])
    outside = _run(inner, monkeypatch, False, *workers, "test_skips.py")
    assert outside.ret == pytest.ExitCode.OK  # the same run passes where CI is not set


def test_b_a_module_skipped_whole_fails_and_so_does_a_gpu_test_skipped_for_another_reason(
        inner, monkeypatch):
    inner.makepyfile(test_module_skip="""
import pytest
pytest.importorskip("a_module_nobody_installed")
""", test_gpu_other="""
import pytest

@pytest.mark.gpu
def test_gpu():
    pytest.skip("torchao is not installed")
""")
    result = _run(inner, monkeypatch, True, "-p", "no:xdist", "test_module_skip.py",
                  "test_gpu_other.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "FAILED CI guard: unexpected skip: test_gpu_other.py::test_gpu: torchao is not installed",
        "FAILED CI guard: unexpected skip: test_module_skip.py: could not import*"])


@pytest.mark.parametrize("workers", [
    ["-p", "no:xdist"],
    pytest.param(["-n", "2"], marks=pytest.mark.multiprocess),  # xdist's worker processes
], ids=["plain", "xdist"])
def test_c_a_gpu_test_that_needs_a_gpu_may_skip_under_ci(inner, monkeypatch, workers):
    inner.makepyfile(test_gpu="""
import pytest

def test_runs():
    pass

@pytest.mark.gpu
def test_on_a_gpu():
    pytest.skip("needs a GPU (none here)")
""")
    result = _run(inner, monkeypatch, True, *workers, "test_gpu.py")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["SKIPPED * needs a GPU (none here)"])
    result.stdout.fnmatch_lines(["CI guards passed: no unexpected skip; 1 tests ran*"])


def _tier_project(pytester: pytest.Pytester, e2e_count: int) -> None:
    """Two unit tests, one e2e, one serial; tier_floors.json records `e2e_count` e2e tests."""
    (pytester.path / "tests").mkdir(exist_ok=True)
    (pytester.path / "tests" / "tier_floors.json").write_text(json.dumps({
        "floor_fraction": 0.95,
        "selections": {"not serial": {"tests": 3, "e2e": e2e_count}, "serial": {"serial": 1}}}))
    (pytester.path / "tests" / "test_tiers.py").write_text("""
import pytest

def test_unit():
    pass

def test_other_unit():
    pass

@pytest.mark.e2e
def test_job():
    pass

@pytest.mark.serial
def test_alone():
    pass

@pytest.mark.gpu
def test_on_a_gpu():
    pytest.skip("needs a GPU")
""")


def test_d_a_tier_under_its_floor_fails_the_run(inner, monkeypatch):
    _tier_project(inner, e2e_count=2)  # floor: 95 % of 2, rounded up: 2
    result = _run(inner, monkeypatch, True, "-p", "no:xdist", "-m", "not serial")
    result.assert_outcomes(passed=3, skipped=1, deselected=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED CI guard: tier 'e2e': 1 tests ran, the floor is 2 "
                                 "(95% of the count recorded in tests/tier_floors.json; *"])
    _tier_project(inner, e2e_count=1)
    met = _run(inner, monkeypatch, True, "-p", "no:xdist", "-m", "not serial")
    assert met.ret == pytest.ExitCode.OK, met.stdout.str()
    serial = _run(inner, monkeypatch, True, "-n", "2", "-m", "serial")  # its own floors
    assert serial.ret == pytest.ExitCode.OK, serial.stdout.str()


def test_d_a_deselected_tier_fails_the_run(inner, monkeypatch):
    """-m without counts (here the e2e tier left out) is a selection CI does not know."""
    _tier_project(inner, e2e_count=1)
    result = _run(inner, monkeypatch, True, "-n", "2", "-m", "not serial and not e2e")
    result.assert_outcomes(passed=2, skipped=1)  # the controller of xdist reports no deselection
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED CI guard: no tier counts for -m 'not serial and not "
                                 "e2e'*"])


def test_d_record_writes_the_counts_a_collection_finds(inner, monkeypatch):
    """`python3 tests/ci_guards.py --record`'s work: counts per selection, gpu tests left out;
    the run that follows meets the floors it set."""
    _tier_project(inner, e2e_count=7)
    written = record(inner.path)
    assert written["selections"] == {"not serial": {"tests": 3, "e2e": 1},
                                     "serial": {"tests": 1, "serial": 1}}
    assert json.loads((inner.path / "tests" / "tier_floors.json").read_text()) == written
    met = _run(inner, monkeypatch, True, "-p", "no:xdist", "-m", "not serial")
    assert met.ret == pytest.ExitCode.OK, met.stdout.str()


def test_skip_and_floor_rules() -> None:
    assert expected_skip({"gpu"}, "needs a GPU")
    assert not expected_skip({"gpu"}, "no torchao")
    assert not expected_skip({"e2e"}, "needs a GPU")
    assert not expected_skip({"gpu"}, "xfail: needs a GPU")
    ran = {"a": {"e2e"}, "b": set()}
    assert floor_problems({"tests": 2, "e2e": 1}, ran) == []
    assert floor_problems({"tests": 3, "docker": 1}, ran) == [
        "tier 'docker': 0 tests ran, the floor is 1", "tier 'tests': 2 tests ran, the floor is 3"]
    # 95 % of the recorded count, rounded up: 1394 may lose 69 tests, a tier of 9 none
    assert floors_of({"tests": 1394, "docker": 9, "e2e": 40}) == {
        "tests": 1325, "docker": 9, "e2e": 38}
    assert tier_counts([{"e2e", "multiprocess"}, set(), {"gpu"}, {"serial"}]) == {
        "tests": 3, "multiprocess": 1, "e2e": 1, "serial": 1}


def test_the_repository_floors_cover_readmes_two_selections() -> None:
    recorded = json.loads((TESTS / "tier_floors.json").read_text())
    assert recorded["floor_fraction"] == 0.95
    selections = recorded["selections"]
    assert set(selections) == {"not serial", "serial"}
    assert {"multiprocess", "e2e", "docker"} <= set(selections["not serial"])
    assert selections["serial"]["serial"] > 0


def test_a_broken_import_is_an_error_and_a_missing_one_fails_only_under_ci(tmp_path, monkeypatch):
    """import_or_skip (used for torchao and transformers): a package that is there but whose own
    import fails raises; one that is not installed skips, or fails under CI=true."""
    package = tmp_path / "ci28_broken_package"
    package.mkdir()
    (package / "__init__.py").write_text("import ci28_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="ci28_missing_dependency"):
        import_or_skip("ci28_broken_package")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="ci28_not_installed is not installed"):
        import_or_skip("ci28_not_installed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: a missing component fails"):
        import_or_skip("ci28_not_installed")
