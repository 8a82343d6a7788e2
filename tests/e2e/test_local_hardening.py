"""Local jobs that never harm each other, never orphan, name the root cause, survive a full disk.

Real processes throughout (torch jobs on 2 hosts x 2 processes where a rank must die on algo-2;
plain scripts where only the process tree matters). Every test runs with TMPDIR pointed at an
empty folder and checks that no job left anything there.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ci_guards import missing_component

from meshtrain import Estimator, JobFailedError
from meshtrain.backends.hosts.artifacts import _write_tar
from meshtrain.backends.local import LocalBackend
from meshtrain.job import TERMINAL_STATUSES

SCRIPTS = Path(__file__).parent / "scripts"
TWO_BY_TWO = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}
ORPHAN_DEADLINE_SECONDS = 30
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "home"


@pytest.fixture
def empty_tmpdir(tmp_path, monkeypatch):
    """TMPDIR for every process of the jobs: an empty folder the test checks afterwards."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size) -> a fresh tmpfs of that size (as root); unmounted in teardown. Where
    mounting is not permitted (not root, no CAP_SYS_ADMIN) the test is skipped with mount's
    message, and fails with it under CI=true (tests/ci_guards.py)."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            missing_component(f"mounting a tmpfs failed here: {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], check=False)


def _wait_for_log(job, text: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in job.job_dir.log_file.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in the job log")


def _wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _cli_stop(job_name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshtrain.cli", "stop", job_name],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def _supervisor_pid(job) -> int:
    return int(job.job_dir.supervisor_pid_file.read_text())


def test_same_named_job_ending_elsewhere_is_untouched_then_supervisor_kill_orphans_nothing(
        home, tmp_path, empty_tmpdir):
    running = Estimator("sleep_forever.py", source_dir=str(SCRIPTS), instance_count=2,
                        distribution=TWO_BY_TWO).fit(wait=False, job_name="twin")
    _wait_for_log(running, "running rank 3")
    before = set(running.processes())
    assert len(before) >= 9  # supervisor, 2 bootstraps, 2 torchrun agents, 4 ranks

    other = Estimator("plain_script.py", source_dir=str(SCRIPTS), instance_count=2,
                      jobs_dir=tmp_path / "other-jobs")
    other.fit(job_name="twin", logs=False)  # same name, another jobs directory: completes
    assert other.latest_training_job.describe()["TrainingJobStatus"] == "Completed"
    assert other.latest_training_job.token != running.token
    assert set(running.processes()) == before  # every process of the first job still runs
    assert running.describe()["TrainingJobStatus"] == "InProgress"

    os.kill(_supervisor_pid(running), signal.SIGKILL)
    assert _wait_until(lambda: running.processes() == [], ORPHAN_DEADLINE_SECONDS), \
        f"left running {ORPHAN_DEADLINE_SECONDS}s after the supervisor died: {running.processes()}"
    # a process past the point where its environment can be read may still be exiting
    assert _wait_until(lambda: all(_gone(pid) for pid in before), 10)
    description = running.describe()
    assert description["TrainingJobStatus"] == "Failed"
    assert "supervisor process died" in description["FailureReason"]
    stopped = _cli_stop("twin")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    running.stop()
    assert running.describe()["TrainingJobStatus"] in TERMINAL_STATUSES
    assert list(empty_tmpdir.iterdir()) == []


def test_stop_after_the_supervisor_was_killed_ends_every_process_left(home, empty_tmpdir):
    job = Estimator("spawn_and_sleep.py", source_dir=str(SCRIPTS)).fit(wait=False)
    _wait_for_log(job, "running with an escapee")
    escapee = int((job.job_dir.host_paths("algo-1").model_dir / "escapee.pid").read_text())
    os.kill(_supervisor_pid(job), signal.SIGKILL)
    # bootstrap and rank die with the supervisor; the detached grandchild has no lifeline
    assert _wait_until(lambda: job.processes() == [escapee], ORPHAN_DEADLINE_SECONDS), \
        job.processes()
    stopped = _cli_stop(job.job_name)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert job.processes() == []
    assert _gone(escapee)
    # `meshtrain stop` looks first: the job ended when its supervisor was killed, and says so
    assert "already ended (Failed); ended 1 process(es) it left behind." in stopped.stdout
    status = json.loads(job.job_dir.status_file.read_text())
    assert status["TrainingJobStatus"] == "Failed"
    assert "supervisor process died" in status["FailureReason"]
    job.stop()  # the API's stop() of that job: nothing left to end, the record stays
    assert list(empty_tmpdir.iterdir()) == []


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie (the supervisor is this test's child until reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("mode, expected", [
    ("kill", "killed by SIGKILL (signal 9)"),
    ("raise", "RuntimeError: rank 3 lost its optimizer state (on purpose)"),
])
def test_root_cause_is_the_rank_that_died_on_algo2_not_its_peers(home, empty_tmpdir, mode,
                                                                 expected):
    for attempt in range(3):  # the blame used to depend on which host exited first
        estimator = Estimator("die_on_algo2.py", source_dir=str(SCRIPTS), instance_count=2,
                              distribution=TWO_BY_TWO, hyperparameters={"mode": mode})
        with pytest.raises(JobFailedError) as info:
            estimator.fit(logs=False)
        reason = info.value.reason
        headline = reason.splitlines()[0]
        assert headline == f"AlgorithmError: rank 3 on algo-2: {expected}", (attempt, reason)
        assert "Failed as a consequence: " in reason and "rank 0 on algo-1" in reason, reason
        if mode == "kill":
            assert reason.splitlines()[1] == \
                'ExtraInfo "OutOfMemory: Process killed by SIGKILL (signal 9)"'
        else:
            assert 'raise RuntimeError("rank 3 lost its optimizer state' in reason  # traceback
        assert len(reason) <= 1024
        assert estimator.latest_training_job.processes() == []
    assert list(empty_tmpdir.iterdir()) == []


def test_ten_concurrent_unnamed_submits_get_ten_names_and_all_complete(home, empty_tmpdir):
    barrier = threading.Barrier(10)
    jobs, errors = [], []

    def submit() -> None:
        estimator = Estimator("plain_script.py", source_dir=str(SCRIPTS))
        barrier.wait()
        try:
            jobs.append(estimator.fit(wait=False))
        except Exception as error:  # reported below: every submit must succeed
            errors.append(error)

    threads = [threading.Thread(target=submit) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len({job.job_name for job in jobs}) == 10
    for job in jobs:
        job.wait(logs=False)
        assert job.describe()["TrainingJobStatus"] == "Completed"
    # A collision on the generated name is resolved with a random suffix, deterministically:
    spec = Estimator("plain_script.py", source_dir=str(SCRIPTS)).build_spec()
    backend = LocalBackend()
    first, _ = backend._create_job_directory(spec)
    second, _ = backend._create_job_directory(spec)
    assert first.job_name == spec.job_name
    assert second.job_name.startswith(spec.job_name + "-") and second.job_name != first.job_name
    assert list(empty_tmpdir.iterdir()) == []


def _fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as error:
        assert error.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_full_disk_fails_the_job_naming_the_path(home, tmpfs, monkeypatch, tmp_path):
    # 1. The job directory's disk fills up while the script runs.
    small_home = tmpfs("small-home", "4m")
    monkeypatch.setenv("MESHTRAIN_HOME", str(small_home))
    estimator = Estimator("fill_disk.py", source_dir=str(SCRIPTS))
    with pytest.raises(JobFailedError) as info:
        estimator.fit(logs=False)
    job = estimator.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Failed"
    assert f"the job directory {job.job_dir.root} is full" in info.value.reason
    assert "No space left on device" in info.value.reason
    assert job.processes() == []

    # 2. The output path is full: no archive (not even a partial one) is left there.
    full_output = tmpfs("full-output", "1m")
    _fill(full_output)
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    estimator = Estimator("plain_script.py", source_dir=str(SCRIPTS),
                          output_path=f"file://{full_output}")
    with pytest.raises(JobFailedError) as info:
        estimator.fit(logs=False)
    target = full_output / estimator.latest_training_job.job_name / "output"
    assert f"not enough space to write the outputs to {target}" in info.value.reason
    assert sorted(p.name for p in target.iterdir()) == []
    with pytest.raises(OSError):  # and an archive that fails half-written is removed
        _write_tar(full_output / "model.tar.gz", {"big": small_home / "jobs" / job.job_name /
                                                  "hosts/algo-1/opt/ml/model/weights.bin"})
    assert not list(full_output.glob("model.tar.gz*"))

    # 3. The jobs directory is full before the job starts: JobFailedError, nothing left behind.
    monkeypatch.setenv("MESHTRAIN_HOME", str(full_output))
    with pytest.raises(JobFailedError, match="No space left on device") as info:
        Estimator("plain_script.py", source_dir=str(SCRIPTS)).fit(job_name="never-made")
    assert str(full_output / "jobs" / "never-made") in info.value.reason
    assert not (full_output / "jobs" / "never-made").exists()
