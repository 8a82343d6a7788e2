"""Ctrl-C through a real pipe whose reader has gone (`python launch.py | head -n 2`, as a `| tee`
the same Ctrl-C ended), from fit(), a script's own wait() and `meshtrain run`, and every CLI
command's output to a closed pipe: the job still stops, the client says so in one line on
stderr, and nothing prints a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interrupts import default_sigint

from meshtrain import Estimator

SCRIPTS = Path(__file__).parent / "scripts"
JOB = "closed-pipe-job"
ESTIMATOR = f"""
from meshtrain import Estimator
estimator = Estimator("print_forever.py", source_dir={str(SCRIPTS)!r}, instance_count=2)
"""
LAUNCHES = {
    "fit": ["-c", ESTIMATOR + f"estimator.fit(job_name={JOB!r})\n"],
    # a script that waits on the handle itself: the backend's own wait() must drop the writes
    "wait": ["-c", ESTIMATOR + f"estimator.fit(job_name={JOB!r}, wait=False).wait()\n"],
    "cli": ["-m", "meshtrain.cli", "run", "print_forever.py", "--source-dir", str(SCRIPTS),
            "--instance-count", "2", "--job-name", JOB],
}
STOPPED = (f"meshtrain: Ctrl-C: stopping job {JOB} ... stopped; its log: meshtrain logs {JOB}")
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _wait_for_log(home: Path, text: str, client: subprocess.Popen) -> None:
    log = home / "jobs" / JOB / "job.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and text in log.read_text()):
        assert client.poll() is None, f"the client ended (rc {client.returncode}) before {text!r}"
        assert time.monotonic() < deadline, f"{text!r} never appeared in the job log"
        time.sleep(0.1)


def _to_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """Run argv with stdout a pipe whose reader is already closed (every write: EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=60, check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("launch", sorted(LAUNCHES))
def test_ctrl_c_after_the_pipes_reader_left_stops_the_job_without_a_traceback(
    home, tmp_path, launch
):
    reader = subprocess.Popen(["head", "-n", "2"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    with open(tmp_path / "stderr.txt", "w") as stderr:
        client = subprocess.Popen([sys.executable, *LAUNCHES[launch]], cwd=tmp_path,
                                  stdout=reader.stdin, stderr=stderr, preexec_fn=default_sigint)
    reader.stdin.close()  # the client holds the pipe's only write end
    try:
        first = reader.stdout.read().splitlines()  # EOF: head has gone
        assert len(first) == 2 and first[0].startswith(f"[meshtrain] job {JOB} · logs: "), first
        reader.wait(timeout=10)
        _wait_for_log(home, "tick 30", client)  # the client has written to the closed pipe
        assert client.poll() is None, "a closed stdout ended the client"
        client.send_signal(signal.SIGINT)
        client.wait(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
        if (home / "jobs" / JOB).exists():  # leave nothing running if the client did not stop it
            job = Estimator.attach(JOB).latest_training_job
            if job.status not in ("Stopped", "Completed", "Failed"):
                job.stop()
    errors = (tmp_path / "stderr.txt").read_text()
    # one line, flushed before the client ended; exit by SIGINT (a script), 130 (the command)
    assert errors.splitlines() == [STOPPED], errors
    assert client.returncode == (130 if launch == "cli" else -signal.SIGINT)
    job = Estimator.attach(JOB).latest_training_job
    assert job.status == "Stopped"
    assert job.processes() == []
    if launch == "fit":  # once: every CLI command's output to a closed pipe, on this job
        _cli_to_a_closed_pipe_prints_no_traceback()


def _cli_to_a_closed_pipe_prints_no_traceback() -> None:
    for argv in (["status", JOB], ["logs", JOB], ["list"], ["plan", "--model", "llama3-8b",
                                                             "--gpus", "8"]):
        done = _to_closed_pipe(sys.executable, "-m", "meshtrain.cli", *argv)
        # 141 as for SIGPIPE; `plan` prints through rich, which exits 1 on a closed pipe
        assert done.returncode == (1 if argv[0] == "plan" else 141), (argv, done.returncode)
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, argv
