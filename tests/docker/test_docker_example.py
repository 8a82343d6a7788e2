"""examples/local_docker runs as a user runs it: no image given (meshtrain's own CPU image, built
once per tier run by the `meshtrain_image` fixture, is found by its tag), and --compare reruns
the job as local processes: the losses are the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from meshtrain.backends.docker.containers import LABEL_TOKEN

ROOT = Path(__file__).resolve().parents[2]


def test_local_docker_example_matches_local_processes(docker_engine, meshtrain_image, tmp_path):
    env = {**os.environ, "MESHTRAIN_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "local_docker" / "launch.py"),
                          "--compare"], env=env, capture_output=True, text=True, timeout=900,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "building" not in run.stderr  # the image of this version was already there
    # the containers' merged, prefixed log (each step's loss once: its metric line)
    assert "[algo-1 rank 0] [meshtrain metric] train:loss=" in run.stdout
    gap = float(re.search(r"largest difference per step (\S+)", run.stdout).group(1))
    assert gap <= 1e-5, run.stdout[-2000:]
    docker_loss = float(re.search(r"local_docker: final loss (\S+)", run.stdout).group(1))
    first = float(re.search(r"\[meshtrain metric\] train:loss=(\S+) step=0", run.stdout).group(1))
    assert docker_loss < 0.8 * first  # it trained
    leftovers = docker_engine.daemon.docker("ps", "--all", "--quiet", "--filter",
                                            f"label={LABEL_TOKEN}")
    assert not leftovers.split(), leftovers  # no container of any job is left
