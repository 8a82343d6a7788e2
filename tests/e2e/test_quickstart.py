"""README's main command: the quickstart job trains (loss falls) and leaves model.pt."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "launch.py"


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_quickstart_job_trains_and_saves_the_model(tmp_path):
    env = {**os.environ, "MESHTRAIN_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(LAUNCH)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    losses = [float(x) for x in re.findall(r"\[algo-1 rank 0\] step \d+ loss ([0-9.]+)",
                                           run.stdout)]
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0], run.stdout
    model_uri = re.search(r"Model artifacts: file://(\S+)", run.stdout).group(1)
    with tarfile.open(model_uri) as tar:
        assert "model.pt" in tar.getnames()
