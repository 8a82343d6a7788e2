"""A finished local_docker job found again by name: Estimator.attach and `meshtrain
status|describe|logs|stop` find it as a Docker job (its handle, its image), beside local jobs."""

from __future__ import annotations

import json
from pathlib import Path

from meshtrain import Estimator
from meshtrain.backends.docker.backend import DockerTrainingJob
from meshtrain.cli import main

SCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "e2e" / "scripts"


def test_a_finished_docker_job_attaches_as_docker_and_the_cli_finds_it(docker_engine, home,
                                                                        tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws"))
    source = tmp_path / "src"
    source.mkdir()
    (source / "hello.py").write_text("print('hello from a container', flush=True)\n")
    Estimator("hello.py", source_dir=str(source), instance_type="local_docker",
              **docker_engine.options()).fit(job_name="boxed", logs=False)
    capsys.readouterr()

    attached = Estimator.attach("boxed")
    job = attached.latest_training_job
    assert isinstance(job, DockerTrainingJob)  # not a plain local job
    assert attached.instance_type == "local_docker"
    assert job.describe()["AlgorithmSpecification"]["TrainingImage"] == docker_engine.image

    assert main(["status", "boxed"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["TrainingJobStatus"] == "Completed"
    assert status["AlgorithmSpecification"]["TrainingImage"] == docker_engine.image
    assert main(["logs", "boxed"]) == 0
    assert "[algo-1] hello from a container" in capsys.readouterr().out
    assert main(["describe", "boxed"]) == 0
    assert f"Image:     {docker_engine.image}" in capsys.readouterr().out.splitlines()
    assert main(["stop", "boxed"]) == 0
    assert capsys.readouterr().out.strip() == ("job boxed already ended (Completed); nothing "
                                               "to stop.")
    assert main(["status", "boxed", "--backend", "local"]) == 2  # not a local-process job
    assert "no local job boxed" in capsys.readouterr().err
