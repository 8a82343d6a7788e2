"""Every bad input is refused before anything exists (issue 12): a table of >= 150 cases.

Each case asserts a ConfigError naming the problem (exit code 2 and no traceback for the CLI),
and that nothing was made: no job directory under the test's jobs_dir, no child process, no
request to (moto's) AWS. The valid controls pass the same checks, so the checks can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_input_cases import CONTROLS, LOCAL_CASES, ML, Paths, make
from bad_input_cases_cli import CLI_CASES
from bad_input_cases_ml import ML_CASES

from meshtrain import ConfigError, Estimator
from meshtrain.cli import main


def child_pids() -> set[int]:
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except FileNotFoundError:  # a (moto server) thread that ended meanwhile
            continue
    return pids


@pytest.fixture
def paths(tmp_path) -> Paths:
    paths = Paths(tmp_path)
    (paths.src / "pkg").mkdir(parents=True)
    paths.a_file.write_text("print('train')\n")
    (paths.src / "run.sh").write_text("echo hi\n")
    (paths.src / "pkg" / "model.py").write_text("SIZE = 1\n")
    (paths.src / "alias.py").symlink_to("train.py")  # a link inside the directory is fine
    paths.data.mkdir()
    (paths.data / "part-0.csv").write_text("1,2\n")
    return paths


def _nothing_exists(paths: Paths, aws, children_before: set[int]) -> None:
    assert not paths.jobs.exists() or not any(paths.jobs.iterdir()), list(paths.jobs.iterdir())
    assert child_pids() <= children_before
    assert aws.requests == [], aws.operations()


def _estimator(paths: Paths, arguments: dict, base: dict) -> Estimator:
    given = make(paths, arguments)
    if "jobs_dir" not in given and not str(given.get("instance_type", base.get(
            "instance_type", "local"))).startswith("ml."):
        given["jobs_dir"] = str(paths.jobs)
    return Estimator(**{**base, **given})


LOCAL_BASE = {"entry_point": "train.py"}
MAX_MESSAGE = 2000
"""No refusal quotes a value at length (a 1.3-million-character repr once made the message)."""


@pytest.mark.parametrize("case", sorted(LOCAL_CASES))
def test_local_bad_input(aws, paths, case):
    arguments, fit_arguments, message = LOCAL_CASES[case]
    before = child_pids()
    with pytest.raises(ConfigError) as error:
        base = {**LOCAL_BASE, "source_dir": str(paths.src)}
        _estimator(paths, arguments, base).fit(**make(paths, fit_arguments))
    assert message in str(error.value)
    assert len(str(error.value)) < MAX_MESSAGE
    _nothing_exists(paths, aws, before)


@pytest.mark.parametrize("case", sorted(ML_CASES))
def test_sagemaker_bad_input(aws, paths, case):
    arguments, fit_arguments, message = ML_CASES[case]
    before = child_pids()
    with pytest.raises(ConfigError) as error:
        base = {**LOCAL_BASE, **ML, "source_dir": str(paths.src)}
        _estimator(paths, arguments, base).fit(
            **{"job_name": "valid-name", "wait": False, **make(paths, fit_arguments)})
    assert message in str(error.value)
    assert len(str(error.value)) < MAX_MESSAGE
    _nothing_exists(paths, aws, before)


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input(aws, paths, case, capsys, monkeypatch):
    for name in ("AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)  # no AWS: unknown jobs are local questions only
    monkeypatch.setenv("MESHTRAIN_HOME", str(paths.root))
    argv = [arg.replace("{src}", str(paths.src)).replace("{data}", str(paths.data))
            for arg in CLI_CASES[case]]
    before = child_pids()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("meshtrain: ", "meshtrain ", "usage:"))
    _nothing_exists(paths, aws, before)


@pytest.mark.parametrize("case", sorted(CONTROLS))
def test_valid_controls_pass(aws, paths, case):
    arguments, fit_arguments = CONTROLS[case]
    estimator = _estimator(paths, arguments, {**LOCAL_BASE, "source_dir": str(paths.src)})
    spec = estimator.build_spec(**make(paths, fit_arguments))
    estimator.backend.validate(spec)
    _nothing_exists(paths, aws, child_pids())


def test_a_valid_sagemaker_control_does_reach_moto(aws, paths):
    """The ML cases' 'no request' assertion can fail: a valid job is seen by moto."""
    base = {**LOCAL_BASE, **ML, "source_dir": str(paths.src)}
    _estimator(paths, {}, base).fit(job_name="valid-name", wait=False)
    assert "SageMaker.CreateTrainingJob" in aws.operations()


def test_the_table_is_large():
    assert len(LOCAL_CASES) + len(ML_CASES) + len(CLI_CASES) >= 150
