"""host.agent_entry: SIGTERM ends the workers and prints one line, no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess
SLEEPER = Path(__file__).parents[2] / "e2e" / "scripts" / "sleep_forever.py"


def test_sigterm_is_a_stop_not_a_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    agent = subprocess.Popen(
        [sys.executable, "-m", "meshtrain_runtime.host.agent_entry", "--nproc-per-node", "2",
         "--tee", "3", "--log-dir", str(tmp_path / "logs"), str(SLEEPER)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    for line in agent.stdout:
        seen.append(line)
        if sum("running rank" in s for s in seen) == 2:
            break
    agent.send_signal(signal.SIGTERM)
    rest, _ = agent.communicate(timeout=120)
    assert agent.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in rest and "SignalException" not in rest
    assert rest.strip().splitlines()[-1] == ("meshtrain: torchrun stopped by SIGTERM; its "
                                             "workers were ended (a stop, not an error)")
