"""local_docker end to end against a real engine: quickstart parity with local processes,
a failing host, stop() and Ctrl-C. Every test ends with no container or network of the job."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from interrupts import default_sigint
from job_privacy import (
    open_directory,
    open_modes,
    readable_by_other_user,
    require_other_user,
    umask,
)

from meshtrain import Estimator, JobFailedError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
CORPUS = ROOT / "examples" / "data" / "corpus"  # the quickstart's `train` channel
SCRIPTS = ROOT / "tests" / "e2e" / "scripts"
TWO_BY_TWO = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}
QUICKSTART_DISTRIBUTION = {**TWO_BY_TWO, "smdistributed": {"modelparallel": {
    "enabled": True, "parameters": {"hybrid_shard_degree": 2}}}}
LOSS = re.compile(r"train:loss=([-\d.eE+]+) step=(\d+)")
ENV = {"OMP_NUM_THREADS": "1"}


def members(uri: str) -> dict[str, bytes]:
    with tarfile.open(uri.removeprefix("file://")) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def run_quickstart(instance_type: str, options: dict) -> tuple[float, float, dict[int, float]]:
    """(seconds from fit() to the first step's metric line, total seconds, loss by step)."""
    estimator = Estimator("train.py", source_dir=str(QUICKSTART), instance_type=instance_type,
                          instance_count=2, hyperparameters={"steps": 4, "lr": 3e-3},
                          distribution=QUICKSTART_DISTRIBUTION, environment=ENV, **options)
    start = time.monotonic()
    job = estimator.fit(inputs={"train": str(CORPUS)}, wait=False)
    first_step = None
    while first_step is None and job.describe()["TrainingJobStatus"] == "InProgress":
        if any(LOSS.search(line) for line in job.log_lines()):
            first_step = time.monotonic() - start
        time.sleep(0.05)
    job.wait(logs=False)
    losses = {int(m.group(2)): float(m.group(1))
              for m in map(LOSS.search, job.log_lines()) if m}
    assert "model.pt" in " ".join(members(estimator.model_data))
    return first_step or float("nan"), time.monotonic() - start, losses


@pytest.fixture
def open_home(monkeypatch):
    """MESHTRAIN_HOME, not made yet, in a 0755 directory, under umask 022 (issue 43)."""
    require_other_user()
    with open_directory() as base, umask(0o022):
        monkeypatch.setenv("MESHTRAIN_HOME", str(base / "home"))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        yield base / "home"


def test_quickstart_on_two_containers_matches_local_processes(docker_engine, open_home):
    docker_first, docker_total, docker_losses = run_quickstart("local_docker",
                                                               docker_engine.options())
    local_first, local_total, local_losses = run_quickstart("local", {})
    print(f"\nquickstart 2 hosts x 2 processes, fit() to first step: local_docker "
          f"{docker_first:.1f} s, local processes {local_first:.1f} s "
          f"(whole job {docker_total:.1f} s vs {local_total:.1f} s)")
    assert sorted(docker_losses) == sorted(local_losses) == [0, 1, 2, 3]
    for step, loss in local_losses.items():
        assert docker_losses[step] == pytest.approx(loss, abs=1e-5)
    assert docker_engine.daemon.docker("ps", "-aq").split() == []
    assert docker_engine.daemon.docker("network", "ls", "-q", "--filter", "type=custom") == ""
    # issue 43: what the containers wrote through their bind mounts (each host's /opt/ml, its
    # work folder, the checkpoint folder) is as private as what the client wrote
    assert readable_by_other_user(open_home) == []
    assert open_modes(open_home) == []


def test_a_failing_host_names_the_root_cause_and_leaves_nothing(docker_engine, home):
    estimator = Estimator("fail_on_algo2.py", source_dir=str(SCRIPTS), instance_type="local_docker",
                          instance_count=2, distribution=TWO_BY_TWO, environment=ENV,
                          **docker_engine.options())
    with pytest.raises(JobFailedError) as failure:
        estimator.fit(logs=False)
    reason = str(failure.value)
    assert "loss became NaN at step 7 (on purpose)" in reason
    assert "algo-2" in reason
    job = estimator.latest_training_job
    assert job.leftovers() == ([], [])
    kept = members(estimator.model_data)  # written by every rank before rank 3 raised
    assert {f"before-failure-{rank}.txt" for rank in range(4)} <= set(kept)


def start_sleeping_job(docker_engine):
    estimator = Estimator("sleep_forever.py", source_dir=str(SCRIPTS),
                          instance_type="local_docker", instance_count=2,
                          distribution=TWO_BY_TWO, environment=ENV, **docker_engine.options())
    job = estimator.fit(wait=False)
    deadline = time.monotonic() + 240
    while not any("running rank 3" in line for line in job.log_lines()):
        assert time.monotonic() < deadline, "the job did not start"
        assert job.describe()["TrainingJobStatus"] == "InProgress"
        time.sleep(0.1)
    assert len(job.leftovers()[0]) == 2  # both containers run
    return job


def test_stop_mid_job_removes_its_containers_and_network(docker_engine, home):
    job = start_sleeping_job(docker_engine)
    job.stop()
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert job.leftovers() == ([], [])


def test_ctrl_c_in_wait_stops_the_job_and_removes_everything(docker_engine, home, tmp_path):
    # In a child interpreter, as a user's script meets Ctrl-C: a SIGINT to this xdist worker
    # read whatever its earlier tests had left in the process (it failed there 2 of 2 times
    # in the whole suite and passed alone), which is not what the test is about.
    script = tmp_path / "wait_for_job.py"
    script.write_text(
        "from meshtrain import Estimator\n"
        f"job = Estimator('sleep_forever.py', source_dir={str(SCRIPTS)!r}, "
        f"instance_type='local_docker', instance_count=2, distribution={TWO_BY_TWO!r}, "
        f"environment={ENV!r}, **{docker_engine.options()!r}).fit(wait=False, "
        "job_name='ctrl-c-in-wait')\n"
        "job.wait(logs=False)\n")
    client = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 240
        log = home / "jobs" / "ctrl-c-in-wait" / "job.log"
        while not (log.exists() and "running rank 3" in log.read_text()):
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.1)
        client.send_signal(signal.SIGINT)
        _, errors = client.communicate(timeout=180)
    finally:
        if client.poll() is None:
            client.kill()
    # one line on stderr, then the script ends by SIGINT without a traceback (issue 46)
    assert client.returncode == -signal.SIGINT and errors.splitlines() == [
        "meshtrain: Ctrl-C: stopping job ctrl-c-in-wait ... stopped; its log: meshtrain logs "
        "ctrl-c-in-wait"], errors
    job = Estimator.attach("ctrl-c-in-wait").latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert job.leftovers() == ([], [])
