"""Local jobs that survive faults: one shared checkpoint folder, restarts, stop with a grace period.

Real jobs of 2 hosts x 2 processes training a fully-sharded MLP (scripts/resilient_train.py)
that saves a DCP checkpoint after every step. One uninterrupted job is the reference; a job
whose last rank SIGKILLs itself on attempt 1 (max_restarts=1), and a job that is stopped and
then resumed by a new job, must reproduce its losses exactly.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from meshtrain import Estimator, JobFailedError

SCRIPTS = Path(__file__).parent / "scripts"
STEPS = 6
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]
LOSS = re.compile(r"step (\d+) loss (\S+)")


def _distribution(**extra) -> dict:
    return {"torch_distributed": {"enabled": True, "processes_per_host": 2, **extra}}


def _estimator(jobs_dir: Path, **overrides) -> Estimator:
    hyperparameters = {"steps": STEPS, **overrides.pop("hyperparameters", {})}
    arguments = {"source_dir": str(SCRIPTS), "instance_count": 2, "jobs_dir": str(jobs_dir),
                 "distribution": _distribution(), "hyperparameters": hyperparameters,
                 **overrides}
    return Estimator("resilient_train.py", **arguments)


def _losses(job) -> dict[int, float]:
    """step -> loss, from the job log (a later attempt's line for a step replaces an earlier)."""
    found = {}
    for line in job.log_lines():
        match = LOSS.search(line)
        if match:
            found[int(match.group(1))] = float(match.group(2))
    return found


def _assert_complete(step_dir: Path, ranks: int = 4) -> None:
    names = {p.name for p in step_dir.iterdir()}
    assert {".metadata", "meshtrain-checkpoint.json"} <= names, names
    assert {f"__{r}_0.distcp" for r in range(ranks)} <= names, names


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("resilience")
    patch.setenv("MESHTRAIN_HOME", str(home / "home"))
    patch.setenv("OMP_NUM_THREADS", "1")
    yield home
    patch.undo()


@pytest.fixture(scope="module")
def reference(env):
    """An uninterrupted job with the default checkpoint folder: (job, losses)."""
    estimator = _estimator(env / "jobs")
    estimator.fit(job_name="reference", logs=False)
    job = estimator.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Completed"
    return job, _losses(job)


def test_default_checkpoint_folder_is_shared_by_the_hosts(reference):
    job, losses = reference
    assert sorted(losses) == list(range(STEPS))
    shared = job.job_dir.root / "checkpoints"
    steps = sorted(p.name for p in shared.iterdir())
    assert steps == [f"step_{STEPS - 2:08d}", f"step_{STEPS - 1:08d}"]  # keep_last=2
    for step in steps:  # one complete checkpoint: metadata, marker and every rank's shard
        _assert_complete(shared / step)
    for host in ("algo-1", "algo-2"):  # nothing split into the hosts' private folders
        private = job.job_dir.host_paths(host).checkpoints_dir
        assert not any(private.iterdir()) if private.exists() else True


def test_a_killed_rank_restarts_every_host_and_reproduces_the_losses(reference, env, capsys):
    _, expected = reference
    estimator = _estimator(env / "jobs", distribution=_distribution(max_restarts=1),
                           hyperparameters={"kill-step": 3})
    estimator.fit(job_name="restarted")
    job = estimator.latest_training_job
    description = job.describe()
    assert description["TrainingJobStatus"] == "Completed"
    (failed,) = description["FailedAttempts"]
    assert failed["Attempt"] == 1
    assert "rank 3" in failed["FailureReason"] and "SIGKILL" in failed["FailureReason"]
    statuses = [t["Status"] for t in description["SecondaryStatusTransitions"]]
    assert statuses[statuses.index("Restarting") + 1] == "Training"
    # the attempt's records were moved aside, so the next attempt was judged on its own
    assert (job.job_dir.root / "hosts" / "algo-2" / "attempts" / "1" / "work").is_dir()
    assert not job.job_dir.host_paths("algo-2").failure_file.exists()
    shown = [line for line in capsys.readouterr().out.splitlines()
             if "attempt 1 of 2 failed" in line]
    assert len(shown) == 1, shown
    log = "\n".join(job.log_lines())
    assert "resumed from step 2 (attempt 2)" in log
    assert _losses(job) == expected  # exactly the uninterrupted run's, final step included
    assert job.processes() == []


def test_stop_saves_the_agreed_step_and_a_new_job_resumes_from_it(reference, env):
    _, expected = reference
    stopping = _estimator(env / "jobs", hyperparameters={"steps": 1000, "step-seconds": 1.0})
    job = stopping.fit(job_name="stopped", wait=False)
    deadline = time.monotonic() + 300
    while "step 1 loss" not in "\n".join(job.log_lines()):
        assert time.monotonic() < deadline, "the job never reached step 1"
        time.sleep(0.2)
    job.stop()
    description = job.describe()
    assert description["TrainingJobStatus"] == "Stopped"
    assert description["FailureReason"].startswith("StopRequested")
    match = re.search(r"stop requested after step (\d+)", "\n".join(job.log_lines()))
    assert match, "the script never saw stop_requested()"
    stopped_at = int(match.group(1))
    assert stopped_at < STEPS - 1
    assert _losses(job) == {step: expected[step] for step in range(stopped_at + 1)}
    folder = job.job_dir.root / "checkpoints"
    _assert_complete(folder / f"step_{stopped_at:08d}")
    assert job.processes() == []

    resuming = _estimator(env / "jobs", checkpoint_local_path=str(folder))
    resuming.fit(job_name="resumed", logs=False)
    resumed = resuming.latest_training_job
    assert f"resumed from step {stopped_at}" in "\n".join(resumed.log_lines())
    losses = _losses(resumed)
    assert sorted(losses) == list(range(stopped_at + 1, STEPS))
    assert losses == {step: expected[step] for step in losses}


def _bootstrap_of(job, host: str) -> int:
    """The PID of `host`'s bootstrap (the process a reclaimed instance's SIGTERM reaches)."""
    base = f"SAGEMAKER_BASE_DIR={job.job_dir.host_paths(host).base}".encode()
    for pid in job.processes():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"meshtrain_runtime.host.bootstrap" in cmdline and base in environ:
            return pid
    raise AssertionError(f"no bootstrap process for {host}")


def _wait_for(job, text: str) -> None:
    deadline = time.monotonic() + 300
    while text not in "\n".join(job.log_lines()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in the job log"
        time.sleep(0.2)


def test_sigterm_to_one_host_stops_the_job_and_every_rank_saves(reference, env):
    _, expected = reference
    estimator = _estimator(env / "jobs", hyperparameters={"steps": 1000, "step-seconds": 1.0})
    job = estimator.fit(job_name="reclaimed", wait=False)
    _wait_for(job, "step 1 loss")
    os.kill(_bootstrap_of(job, "algo-2"), signal.SIGTERM)  # as a spot reclaim does
    job.wait(logs=False)
    description = job.describe()
    assert description["TrainingJobStatus"] == "Stopped"
    assert description["FailureReason"].startswith("HostStopped: host algo-2")
    match = re.search(r"stop requested after step (\d+)", "\n".join(job.log_lines()))
    assert match, "the script never saw stop_requested()"
    _assert_complete(job.job_dir.root / "checkpoints" / f"step_{int(match.group(1)):08d}")
    losses = _losses(job)
    assert sorted(losses) == list(range(int(match.group(1)) + 1))
    assert {s: losses[s] for s in expected if s in losses} == {
        s: expected[s] for s in expected if s in losses}
    assert job.processes() == []


def test_a_rank_that_ignores_the_stop_is_killed_after_the_grace_period(env):
    estimator = Estimator("ignore_stop.py", source_dir=str(SCRIPTS), jobs_dir=str(env / "jobs"),
                          distribution=_distribution(stop_grace_seconds=2))
    job = estimator.fit(job_name="stubborn", wait=False)
    _wait_for(job, "watching for a stop")
    job.stop()
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert "stop requested; not stopping" in "\n".join(job.log_lines())  # it got SIGTERM
    assert job.processes() == []


def test_when_every_restart_fails_the_job_fails_with_the_last_attempts_reason(env, capsys):
    estimator = Estimator("fail_every_attempt.py", source_dir=str(SCRIPTS),
                          jobs_dir=str(env / "jobs"),
                          distribution={"torch_distributed": {"max_restarts": 2}})
    with pytest.raises(JobFailedError, match="attempt 3 lost its data"):
        estimator.fit(job_name="hopeless")
    description = estimator.latest_training_job.describe()
    assert description["TrainingJobStatus"] == "Failed"
    assert [a["Attempt"] for a in description["FailedAttempts"]] == [1, 2]
    for attempt in description["FailedAttempts"]:
        assert f"attempt {attempt['Attempt']} lost its data" in attempt["FailureReason"]
    out = capsys.readouterr().out
    assert out.count("of 3 failed: ") == 2  # one line per failed attempt that was restarted
