"""Local jobs end to end: Estimator(...).fit() on 2 hosts x 2 processes, failure, stop, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

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


def members(uri: str) -> dict[str, bytes]:
    with tarfile.open(uri.removeprefix("file://")) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_two_hosts_two_processes_see_the_sagemaker_contract(home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard-0.txt").write_text("1 2 3")
    hps = {"epochs": 2, "lr": 0.5, "model": "tiny", "flag": True, "cfg": {"b": 1, "a": "x"}}
    estimator = Estimator("report_env.py", source_dir=str(SCRIPTS), hyperparameters=hps,
                          instance_count=2, distribution=TWO_BY_TWO)
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
        assert view["argv"] == ["--cfg", "a=x,b=1", "--epochs", "2", "--flag", "True",
                                "--lr", "0.5", "--model", "tiny"]
        assert view["cwd"].endswith("/opt/ml/code")
    outputs = members(estimator.model_data.replace("model.tar.gz", "output.tar.gz"))
    assert sorted(outputs) == [f"out-{r}.txt" for r in range(4)]
    job = estimator.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Completed"
    assert job.processes() == []
    attached = Estimator.attach(job.job_name)
    assert attached.model_data == estimator.model_data
    assert attached.hyperparameters == hps


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


def test_stop_ends_every_process(home):
    estimator = Estimator("sleep_forever.py", source_dir=str(SCRIPTS), instance_count=2,
                          distribution=TWO_BY_TWO)
    job = estimator.fit(wait=False)
    _wait_for_log(job, "running rank 3")
    assert len(job.processes()) >= 8  # supervisor, 2 bootstraps, 2 torchruns, 4 ranks
    job.stop()
    assert job.describe()["TrainingJobStatus"] == "Stopped"
    assert job.processes() == []


def test_keyboard_interrupt_in_fit_stops_the_job(home):
    client = subprocess.Popen(
        [sys.executable, "-c", (
            "from meshtrain import Estimator\n"
            f"Estimator('sleep_forever.py', source_dir={str(SCRIPTS)!r}, instance_count=2,"
            f" distribution={TWO_BY_TWO!r}).fit(job_name='ctrl-c-job')\n")],
        env={**os.environ}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
