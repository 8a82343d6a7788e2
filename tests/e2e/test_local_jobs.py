"""Local jobs end to end: Estimator(...).fit() on 2 hosts x 2 processes, failure, stop, Ctrl-C.
The contract job and the stopped job also check that a job is its owner's alone (issue 43):
files, listening sockets, another user's stop and rm."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from interrupts import default_sigint
from job_privacy import (
    every_path,
    listeners,
    meshtrain_as_other_user,
    open_directory,
    open_modes,
    readable_by_other_user,
    umask,
)

from meshtrain import Estimator, JobFailedError
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.processes import pids_of_job

SCRIPTS = Path(__file__).parent / "scripts"
TWO_BY_TWO = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "home"


SECRET_ENV = "hf_env-secret-4f1c9a"
SECRET_HP = "hp-secret-77d2e0"


@pytest.fixture
def open_home(monkeypatch):
    """MESHTRAIN_HOME, not made yet, inside a 0755 directory (a home directory's default
    mode), under umask 022: what meshtrain makes there must still be its owner's alone (tried
    as another user where root can: a skip outside CI, after the test's other checks)."""
    with open_directory() as base, umask(0o022):
        monkeypatch.setenv("MESHTRAIN_HOME", str(base / "home"))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        yield base / "home"


def members(uri: str) -> dict[str, bytes]:
    with tarfile.open(uri.removeprefix("file://")) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_two_hosts_two_processes_see_the_sagemaker_contract(open_home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-0.txt").write_text("1 2 3")
    hps = {"epochs": 2, "lr": 0.5, "model": "tiny", "flag": True, "cfg": {"b": 1, "a": "x"},
           "api_key": SECRET_HP}
    estimator = Estimator("report_env.py", source_dir=str(SCRIPTS), hyperparameters=hps,
                          instance_count=2, distribution=TWO_BY_TWO,
                          environment={"SECRET_TOKEN": SECRET_ENV})
    estimator.fit({"train": str(data)}, logs=False)

    files = members(estimator.model_data)
    seen = {int(name[5:-5]): json.loads(body) for name, body in files.items()
            if name.startswith("rank-")}
    assert sorted(seen) == [0, 1, 2, 3]
    assert seen[0]["env"]["SM_CURRENT_HOST"] == "algo-1"  # algo-1's first process is rank 0
    for rank, view in seen.items():
        env = view["env"]
        assert env["WORLD_SIZE"] == "4"
        assert env["SM_CURRENT_HOST"] == ("algo-1" if rank < 2 else "algo-2")
        assert json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
        assert env["SM_CHANNEL_TRAIN"].endswith("/input/data/train")
        assert view["channel_files"] == ["shard-0.txt"]
        assert env["SM_MODEL_DIR"].endswith("/opt/ml/model")
        assert env["SM_HP_EPOCHS"] == "2" and env["SM_HP_MODEL"] == "tiny"
        assert env["SM_HP_CFG"] == '{"a":"x","b":1}'
        assert json.loads(env["SM_HPS"]) == hps
        assert json.loads(env["SM_CHANNELS"]) == ["train"]
        assert view["argv"] == ["--api_key", SECRET_HP, "--cfg", "a=x,b=1", "--epochs", "2",
                                "--flag", "True", "--lr", "0.5", "--model", "tiny"]
        assert view["cwd"].endswith("/opt/ml/code")
        assert view["secret_sha256"] == hashlib.sha256(SECRET_ENV.encode()).hexdigest()
    outputs = members(estimator.model_data.replace("model.tar.gz", "output.tar.gz"))
    assert sorted(outputs) == [f"out-{r}.txt" for r in range(4)]
    job = estimator.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Completed"
    assert job.processes() == []
    attached = Estimator.attach(job.job_name)
    assert attached.model_data == estimator.model_data
    assert attached.hyperparameters == hps
    _assert_private(open_home, job)


def _assert_private(home: Path, job) -> None:
    """Issue 43: nothing of the job is open to another user, and the environment's secret is in
    no file (the hyperparameter's is where SageMaker's contract puts it, and describe() shows
    it to the owner as DescribeTrainingJob does)."""
    assert open_modes(home) == []
    holding = [str(p) for p in every_path(home) if p.is_file() and not p.is_symlink()
               and SECRET_ENV.encode() in p.read_bytes()]
    assert holding == []
    config = job.job_dir.host_paths("algo-2").hyperparameters_file
    assert json.loads(config.read_text())["api_key"] == json.dumps(SECRET_HP)
    description = job.describe()
    assert description["Environment"] == {"SECRET_TOKEN": "<masked>"}
    assert description["HyperParameters"]["api_key"] == json.dumps(SECRET_HP)
    assert readable_by_other_user(home) == []


def test_failure_on_one_host_stops_the_others_and_keeps_outputs(home):
    estimator = Estimator("fail_on_algo2.py", source_dir=str(SCRIPTS), instance_count=2,
                          distribution=TWO_BY_TWO)
    started = time.monotonic()
    with pytest.raises(JobFailedError) as info:
        estimator.fit(logs=False)
    assert time.monotonic() - started < 120  # the sleeping hosts were stopped, not waited for
    message = str(info.value)
    assert "loss became NaN at step 7 (on purpose)" in message
    assert "algo-2" in message and "rank 3" in message
    description = estimator.latest_training_job.describe()
    assert description["TrainingJobStatus"] == "Failed"
    assert "ValueError: loss became NaN" in description["FailureReason"]
    assert estimator.latest_training_job.processes() == []
    kept = members(estimator.model_data)
    assert {f"before-failure-{r}.txt" for r in range(4)} <= set(kept)


def _wait_for_log(job, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in job.job_dir.log_file.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in the job log")


def test_stop_ends_every_process(open_home):
    estimator = Estimator("sleep_forever.py", source_dir=str(SCRIPTS), instance_count=2,
                          distribution=TWO_BY_TWO)
    job = estimator.fit(wait=False)
    try:
        _wait_for_log(job, "running rank 3")
        running = job.processes()
        assert len(running) >= 8  # supervisor, 2 bootstraps, 2 torchruns, 4 ranks
        listening = listeners(running)  # torchrun's rendezvous store, gloo's pairs
        assert listening and [s for s in listening if not s.loopback] == [], listening
        _another_user_cannot_stop_or_remove(open_home, job)  # then the owner stops it
    finally:
        job.stop()
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert job.processes() == []


def _another_user_cannot_stop_or_remove(home: Path, job) -> None:
    """Issue 43: `meshtrain stop` / `rm` as another user end and delete nothing, whether the
    job's files are closed to that user (they are) or open (a job made before, emulated with
    chmod); a process of that user carrying a copy of the token is not taken for the job's."""
    def cli(*argv: str) -> subprocess.CompletedProcess:
        return meshtrain_as_other_user(*argv, job.job_name,
                                       env={**os.environ, "MESHTRAIN_HOME": str(home)})

    stop = cli("stop", "--backend", "local")
    assert stop.returncode == 2 and "permission denied" in stop.stderr, stop.stderr
    subprocess.run(["chmod", "-R", "go+rX", str(home)], check=True)  # as a legacy job's
    runner = subprocess.Popen(["runuser", "-u", "nobody", "--", "env",
                               f"MESHTRAIN_JOB_TOKEN={job.token}", "sleep", "300"])
    forged = None
    try:
        forged = _child_carrying(runner.pid, job.token)
        for argv, action in ((("stop", "--backend", "local"), "stop"), (("rm",), "remove")):
            refused = cli(*argv)
            assert refused.returncode == 2, refused.stderr
            assert (f"belongs to user root (uid 0), not to user nobody (uid 65534): only its "
                    f"owner can {action} it") in refused.stderr
        assert forged not in job.processes()
        assert job.describe()["TrainingJobStatus"] == "InProgress" and job.job_dir.root.is_dir()
        job.stop()
        assert Path(f"/proc/{forged}").exists()  # the owner's stop never signalled the copy
    finally:
        if forged is not None:
            os.kill(forged, signal.SIGKILL)
        runner.kill()
        runner.wait()


def _child_carrying(parent: int, token: str, timeout: float = 30) -> int:
    """The pid of `parent`'s child whose environment carries `token` (once it has exec'd)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                if f"PPid:\t{parent}\n" in status.read_text() and (
                        f"MESHTRAIN_JOB_TOKEN={token}".encode()
                        in (status.parent / "environ").read_bytes().split(b"\0")):
                    return int(status.parent.name)
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError("the other user's process carrying the token never started")


def test_keyboard_interrupt_in_fit_stops_the_job(home):
    client = subprocess.Popen(
        [sys.executable, "-c", (
            "from meshtrain import Estimator\n"
            f"Estimator('sleep_forever.py', source_dir={str(SCRIPTS)!r}, instance_count=2,"
            f" distribution={TWO_BY_TWO!r}).fit(job_name='ctrl-c-job')\n")],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint)
    deadline = time.monotonic() + 60
    log = home / "jobs" / "ctrl-c-job" / "job.log"
    while not (log.exists() and "running rank 3" in log.read_text()):
        assert time.monotonic() < deadline, "job never started"
        time.sleep(0.2)
    client.send_signal(signal.SIGINT)
    output, _ = client.communicate(timeout=90)
    assert client.returncode == -signal.SIGINT and "Traceback" not in output
    assert output.splitlines()[-1] == ("meshtrain: Ctrl-C: stopping job ctrl-c-job ... stopped; "
                                       "its log: meshtrain logs ctrl-c-job")
    status = json.loads((home / "jobs" / "ctrl-c-job" / "status.json").read_text())
    assert status["TrainingJobStatus"] == "Stopped"
    assert pids_of_job(JobDirectory(home / "jobs" / "ctrl-c-job").read_token()) == []


def test_plain_script_without_torchrun_runs_once_per_host(home):
    estimator = Estimator("plain_script.py", source_dir=str(SCRIPTS), instance_count=2,
                          hyperparameters={"a": 1})
    estimator.fit(logs=False)
    assert members(estimator.model_data) == {"algo-1.txt": b"-a 1", "algo-2.txt": b"-a 1"}


def test_script_without_source_dir_runs_and_reattaches(home, monkeypatch):
    monkeypatch.chdir(SCRIPTS)
    estimator = Estimator("plain_script.py", hyperparameters={"b": 2})
    estimator.fit(logs=False)
    assert members(estimator.model_data) == {"algo-1.txt": b"-b 2"}
    again = Estimator.attach(estimator.latest_training_job.job_name)
    assert again.build_spec().source_dir == str(SCRIPTS / "plain_script.py")
