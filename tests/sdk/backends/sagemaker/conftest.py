"""Fixtures: moto serving HTTP on 127.0.0.1 (see sagemaker_moto.py) and a clean AWS environment."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sagemaker_moto import RecordingMotoServer, point_boto3_at


@pytest.fixture(scope="session")
def moto_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = RecordingMotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def aws(moto_server, monkeypatch, tmp_path):
    """A clean moto and an environment whose only AWS configuration points boto3 at it."""
    point_boto3_at(moto_server, monkeypatch, tmp_path)
    moto_server.reset()
    return moto_server


@pytest.fixture
def stop_training_job(monkeypatch):
    """Teach moto StopTrainingJob (it lacks it): the job turns Stopping, as on SageMaker."""
    from moto.core.responses import ActionResult
    from moto.sagemaker.responses import SageMakerResponse

    stopped: list[str] = []

    def stop(self: SageMakerResponse) -> ActionResult:
        name = self._get_param("TrainingJobName")
        job = self.sagemaker_backend.training_jobs[name]
        job.training_job_status = job.secondary_status = "Stopping"
        job.secondary_status_transitions.append({
            "Status": "Stopping", "StartTime": datetime.now(timezone.utc),
            "StatusMessage": "Stopping the training job"})
        stopped.append(name)
        return ActionResult({})

    monkeypatch.setattr(SageMakerResponse, "stop_training_job", stop, raising=False)
    return stopped


@pytest.fixture
def source(tmp_path) -> Path:
    """A source_dir with code, a package, and the junk that must stay out of the tarball."""
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('training')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("SIZE = 64\n")
    (root / "requirements.txt").write_text("numpy\n")
    for junk in (".git/HEAD", "__pycache__/train.cpython-311.pyc", "pkg/__pycache__/m.pyc",
                 ".ipynb_checkpoints/nb-checkpoint.ipynb", "stale.pyc"):
        (root / junk).parent.mkdir(parents=True, exist_ok=True)
        (root / junk).write_text("junk")
    return root
