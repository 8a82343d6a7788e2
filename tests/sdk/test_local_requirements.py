"""requirements.txt of a local job: installed into a cached per-job environment, never into the
interpreter that runs the tests (issue 11). The package is a wheel built here (no network)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from meshtrain import Estimator, JobFailedError

pytestmark = pytest.mark.multiprocess
PACKAGE = "meshtrain_tinyreq"


def build_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel: one module that says where it was imported from."""
    wheel = directory / f"{PACKAGE}-1.0-py3-none-any.whl"
    info = f"{PACKAGE}-1.0.dist-info"
    files = {
        f"{PACKAGE}/__init__.py": "import os\nWHERE = os.path.dirname(__file__)\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        record = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
        archive.writestr(f"{info}/RECORD", record)
    return wheel


@pytest.fixture
def source(tmp_path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    wheel = build_wheel(tmp_path)
    (root / "requirements.txt").write_text(f"{wheel}\n")
    (root / "train.py").write_text(
        "import json, os, sys\n"
        f"import {PACKAGE}\n"
        "with open(os.path.join(os.environ['SM_MODEL_DIR'], 'where.json'), 'w') as f:\n"
        f"    json.dump({{'where': {PACKAGE}.WHERE}}, f)\n")
    return root


def _log(estimator: Estimator) -> str:
    return (Path(estimator.latest_training_job.job_dir.log_file)).read_text()


def test_requirements_go_into_a_cached_job_environment(source, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MESHTRAIN_HOME", str(home))
    first = Estimator("train.py", source_dir=str(source))
    first.fit(job_name="first", logs=False)
    log = _log(first)
    envs = [p for p in (home / "envs").iterdir() if p.is_dir()]
    assert len(envs) == 1
    assert f"requirements.txt: installing into the job environment {envs[0]}" in log
    assert "Successfully installed meshtrain-tinyreq-1.0" in log  # pip output, in the job log
    with tarfile.open(first.model_data.removeprefix("file://")) as tar:
        where = json.load(tar.extractfile("where.json"))["where"]
    assert where.startswith(str(envs[0]))
    # The interpreter running this test (the user's) did not get the package.
    assert importlib.util.find_spec(PACKAGE) is None
    check = subprocess.run([sys.executable, "-c", f"import {PACKAGE}"], capture_output=True)
    assert check.returncode != 0

    second = Estimator("train.py", source_dir=str(source))
    second.fit(job_name="second", logs=False)
    log = _log(second)
    assert f"requirements.txt: reusing the job environment {envs[0]}" in log
    assert "Successfully installed" not in log  # pip did not run again


def test_a_failed_install_fails_the_job_and_leaves_no_environment(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MESHTRAIN_HOME", str(home))
    root = tmp_path / "src"
    root.mkdir()
    (root / "requirements.txt").write_text(f"{tmp_path}/no-such-1.0-py3-none-any.whl\n")
    (root / "train.py").write_text("print('never')\n")
    with pytest.raises(JobFailedError, match="InstallRequirementsError"):
        Estimator("train.py", source_dir=str(root)).fit(job_name="bad-reqs", logs=False)
    assert [p for p in (home / "envs").iterdir() if p.is_dir()] == []
