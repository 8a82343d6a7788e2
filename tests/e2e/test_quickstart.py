"""README's main command: the quickstart job trains (loss falls) and leaves model.pt; what its
piped output shows before the first step (the job's name, its log, how to stop it, one line per
phase) and that each step's loss is in it once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from meshtrain.contract.metrics import parse_metric_records

LAUNCH = Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "launch.py"
JOB = re.compile(r"^\[meshtrain\] job (quickstart-\S+) · logs: meshtrain logs \1 -f \((\S+)\) · "
                 r"stop: Ctrl-C or meshtrain stop \1$")


def _start_lines(lines: list[str]) -> list[str]:
    """The output up to the line that ends the start (right after the first step's)."""
    end = next(i for i, line in enumerate(lines) if " first step after " in line)
    return lines[:end + 1]


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_quickstart_job_trains_and_saves_the_model(tmp_path):
    env = {**os.environ, "MESHTRAIN_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(LAUNCH)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    # the first line: the job's name (base_job_name), its log file and how to stop it
    first = JOB.match(lines[0])
    assert first, lines[:3]
    name, log = first.groups()
    assert Path(log) == tmp_path / "jobs" / name / "job.log"
    # then one line per phase, each once, all before the first step's line and its metric
    start = _start_lines(lines)
    phase_lines = [line for line in start if line.startswith(f"[meshtrain] {name}: ")]
    for phase in ("starts torchrun: 2 processes on each of 2 hosts", "4 ranks joined (gloo)",
                  "TinyLM on pp 1 x replicate 2 x shard 2 x tp 1", "first step after"):
        assert sum(phase in line for line in phase_lines) == 1, (phase, phase_lines)
    raw = [line for line in lines if "[meshtrain phase]" in line]
    assert not raw, raw  # the view says them itself
    first_metric = next(i for i, line in enumerate(lines) if parse_metric_records(line))
    assert first_metric == len(start) - 2  # step 0's metric line, then the line saying so
    # each step's loss once: its metric line (progress lines are summaries)
    losses = {}
    for line in lines:
        for record in parse_metric_records(line):
            assert record.step not in losses, f"step {record.step}'s loss twice"
            losses[record.step] = record.value
    assert sorted(losses) == list(range(20)) and losses[19] < 0.8 * losses[0], run.stdout
    printed = [line for line in lines if "loss" in line and not line.startswith("[meshtrain]")
               and not parse_metric_records(line)]
    assert [line.split("] ", 1)[1] for line in printed] == [f"final loss {losses[19]:.4f}"]
    model_uri = re.search(r"Model artifacts: file://(\S+)", run.stdout).group(1)
    with tarfile.open(model_uri) as tar:
        assert "model.pt" in tar.getnames()
