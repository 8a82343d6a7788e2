"""meshtrain's own CPU image, built with no registry: by fit() on first use (with a progress
line), cached by tag; `meshtrain image build --base` puts meshtrain's layer on another image."""

from __future__ import annotations

from pathlib import Path

import meshtrain
from meshtrain import Estimator
from meshtrain.backends.docker.image import base_tag, image_version
from meshtrain.cli import main

SCRIPTS = Path(__file__).resolve().parents[2] / "tests" / "e2e" / "scripts"


def test_fit_without_image_uri_builds_meshtrains_image_and_runs_in_it(docker_engine,
                                                                      meshtrain_image, home,
                                                                      capfd):
    docker_engine.daemon.docker("rmi", meshtrain_image)  # the base stays: only the layer
    estimator = Estimator("plain_script.py", source_dir=str(SCRIPTS),
                          instance_type="local_docker", instance_count=2)
    estimator.fit(logs=False)
    assert f"building {meshtrain_image} for local Docker jobs" in capfd.readouterr().err
    assert image_version(meshtrain_image) == meshtrain.__version__
    job = estimator.latest_training_job
    assert job.describe()["AlgorithmSpecification"]["TrainingImage"] == meshtrain_image
    assert job.leftovers() == ([], [])

    assert main(["image", "build"]) == 0  # cached by tag: nothing to build
    assert f"{meshtrain_image} ready" in capfd.readouterr().out


def test_image_build_on_another_base(docker_engine, meshtrain_image, capfd):
    tag = "meshtrain-on-base:test"
    assert main(["image", "build", "--base", base_tag(), "--tag", tag]) == 0
    out = docker_engine.daemon.docker(
        "run", "--rm", "--network", "none", tag, "sh", "-c",
        "command -v train && python -c 'import meshtrain_runtime.host.bootstrap, torch, "
        "meshtrain; print(meshtrain.__version__, torch.__version__)'")
    assert "/usr/local/bin/train" in out and meshtrain.__version__ in out
    assert main(["image", "build", "--base", "no/such:image", "--tag", "x:1"]) == 2
    assert "no such image" in capfd.readouterr().err
