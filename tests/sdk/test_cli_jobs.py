"""The `meshtrain` command on real local jobs (plain Python scripts, no torchrun): list (its
script column, --wide), stop, run --no-wait, unknown names, Ctrl-C in fit() and in `meshtrain
run` (one line on stderr), max_run, describe (the layout, the history)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interrupts import default_sigint

from meshtrain import Estimator
from meshtrain.cli import main

pytestmark = pytest.mark.multiprocess
NO_AWS = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
          "AWS_EC2_METADATA_DISABLED": "true", "KUBECONFIG": "/nonexistent"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in NO_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def scripts(tmp_path) -> Path:
    root = tmp_path / "scripts"
    root.mkdir()
    (root / "hello.py").write_text("print('hello from the job', flush=True)\n")
    (root / "sleep.py").write_text("import time\nprint('sleeping', flush=True)\n"
                                   "time.sleep(300)\n")
    return root


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def test_list_shows_local_jobs_newest_first(home, scripts, capsys):
    for name in ("first-job", "second-job"):
        assert main(["run", str(scripts / "hello.py"), "--job-name", name]) == 0
    out = capsys.readouterr().out
    assert "hello from the job" in out
    assert f"job second-job: model data at file://{home}/jobs/second-job/output/model.tar.gz" in out
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT", "REASON"]
    assert [line.split()[:2] for line in lines[1:]] == [["second-job", "Completed"],
                                                        ["first-job", "Completed"]]
    assert all(re.fullmatch(r"\d+m\d\ds", line.split()[-2]) for line in lines[1:])
    assert all(line.split()[-1] == "hello.py" for line in lines[1:])
    assert main(["list", "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT", "LAYOUT",
                                "SOURCE", "REASON"]
    # a script sent alone: its source is the script itself; one host x one process
    assert lines[1].split()[-3:] == ["hello.py", "1x1", str(scripts / "hello.py")]


def test_no_wait_then_stop_says_what_it_did(home, scripts, capsys):
    assert main(["run", str(scripts / "sleep.py"), "--job-name", "sleeper", "--no-wait"]) == 0
    out = capsys.readouterr().out
    assert "job sleeper started" in out and "model data" not in out
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["sleeper", "InProgress"]
    log = home / "jobs" / "sleeper" / "job.log"
    deadline = time.monotonic() + 120
    while "sleeping" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)  # stop a job that runs (not one whose supervisor is still starting)
    assert main(["stop", "sleeper"]) == 0
    assert capsys.readouterr().out.strip() == "Stopping job sleeper ... stopped"
    assert main(["stop", "sleeper"]) == 0
    assert capsys.readouterr().out.strip() == ("job sleeper already ended (Stopped); nothing "
                                               "to stop.")
    assert main(["status", "sleeper"]) == 0
    assert json.loads(capsys.readouterr().out)["TrainingJobStatus"] == "Stopped"
    assert main(["logs", "sleeper"]) == 0
    assert "[algo-1] sleeping" in capsys.readouterr().out


def test_stop_right_after_start_is_stopped_not_failed(home, scripts, capsys):
    """SIGTERM may reach the supervisor before its handler exists: the job was still stopped."""
    for attempt in range(3):
        name = f"early-{attempt}"
        assert main(["run", str(scripts / "sleep.py"), "--job-name", name, "--no-wait"]) == 0
        assert main(["stop", name]) == 0
        capsys.readouterr()
        assert main(["status", name]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["TrainingJobStatus"] == "Stopped", status.get("FailureReason")


@pytest.mark.parametrize("command", ["status", "logs", "stop"])
def test_unknown_job_is_one_line_and_exit_2(home, command):
    env = {**os.environ, **NO_AWS}
    done = subprocess.run([sys.executable, "-m", "meshtrain.cli", command, "no-such-job"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    # one line: where it looked, and each backend it could not search with the fix
    assert done.stderr.startswith(f"meshtrain: no local job no-such-job under {home}/jobs")
    assert len(done.stderr.splitlines()) == 1 and "; not searched: " in done.stderr
    assert ("SageMaker (no AWS region or credentials: pass --region / configure AWS)"
            in done.stderr)
    assert re.search(r"Kubernetes \(no kubeconfig .*: set KUBECONFIG or pass --kubeconfig\)",
                     done.stderr)
    assert done.stdout == ""


def _start(argv: list[str], home: Path) -> subprocess.Popen:
    env = {**os.environ, **NO_AWS, "MESHTRAIN_HOME": str(home)}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=default_sigint)


def _interrupt_when_running(client: subprocess.Popen) -> tuple[str, str]:
    """SIGINT once the job's script has printed; (stdout, stderr) of the client."""
    seen = []
    while not seen or "sleeping" not in seen[-1]:  # the job's own line: it is running
        seen.append(client.stdout.readline())
        assert seen[-1], f"the client ended first: {seen}"
    client.send_signal(signal.SIGINT)
    out, err = client.communicate(timeout=120)
    return "".join(seen) + out, err


def test_ctrl_c_in_fit_stops_the_job_and_says_so(home, scripts, tmp_path):
    program = tmp_path / "launch.py"
    program.write_text(
        "from meshtrain import Estimator\n"
        f"Estimator('sleep.py', source_dir={str(scripts)!r}).fit(job_name='interrupted')\n")
    client = _start([sys.executable, str(program)], home)
    out, err = _interrupt_when_running(client)
    # the caller's program stops, as Ctrl-C means: by SIGINT, after one line and no traceback
    assert client.returncode == -signal.SIGINT
    assert err.splitlines() == ["meshtrain: Ctrl-C: stopping job interrupted ... stopped; its "
                                "log: meshtrain logs interrupted"]
    assert out.splitlines()[0] == (
        f"[meshtrain] job interrupted · logs: meshtrain logs interrupted -f "
        f"({home}/jobs/interrupted/job.log) · stop: Ctrl-C or meshtrain stop interrupted")
    status = json.loads((home / "jobs" / "interrupted" / "status.json").read_text())
    assert status["TrainingJobStatus"] == "Stopped"
    supervisor = int((home / "jobs" / "interrupted" / "supervisor.pid").read_text())
    assert not _alive(supervisor)


def test_ctrl_c_in_meshtrain_run_exits_130_without_traceback(home, scripts):
    client = _start([sys.executable, "-m", "meshtrain.cli", "run", str(scripts / "sleep.py"),
                     "--job-name", "cli-interrupted"], home)
    _, err = _interrupt_when_running(client)
    assert client.returncode == 130
    assert err.splitlines() == ["meshtrain: Ctrl-C: stopping job cli-interrupted ... stopped; "
                                "its log: meshtrain logs cli-interrupted"]


def test_max_run_names_max_runtime_exceeded(home, scripts, capsys):
    estimator = Estimator("sleep.py", source_dir=str(scripts), max_run=2)
    started = time.monotonic()
    job = estimator.fit(job_name="too-long")  # a stopped job is not an error (SDK behaviour)
    assert time.monotonic() - started < 120
    assert job.status == "Stopped"
    out = capsys.readouterr().out
    assert ("Training job too-long was stopped: MaxRuntimeExceeded: the job ran past "
            "max_run=2s.") in out


def test_a_finished_local_job_by_name_describe_list_reason_rm_and_prune(home, scripts, capsys):
    """One ended job of each outcome: attach, status, describe, logs -f (ending with the
    outcome), stop, the list's reason column, did-you-mean, rm and prune."""
    (scripts / "bad.py").write_text("print('about to fail', flush=True)\n"
                                    "raise ValueError('bad batch size')\n")
    assert main(["run", str(scripts / "hello.py"), "--job-name", "good-one"]) == 0
    assert main(["run", str(scripts / "bad.py"), "--job-name", "bad-one"]) == 1
    capsys.readouterr()
    attached = Estimator.attach("bad-one")
    assert type(attached.latest_training_job).__name__ == "LocalTrainingJob"
    assert attached.entry_point == "bad.py" and attached.instance_type == "local"

    assert main(["list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["bad-one"].endswith("AlgorithmError: rank 0 on algo-1: ValueError: bad batch size")
    assert rows["good-one"].split()[1] == "Completed" and "Error" not in rows["good-one"]
    assert main(["describe", "bad-one"]) == 0
    view = capsys.readouterr().out.splitlines()
    assert "Status:    Failed" in view and "Instances: 1 x local" in view
    assert f"Script:    bad.py (source: {scripts / 'bad.py'})" in view
    assert "Hosts:     1 host x 1 process = 1 rank; none" in view
    history = [line.split(None, 2)[2] for line in view[view.index("History:") + 1:-1]]
    assert history[1] == "Training    Training in progress."  # no image was downloaded
    assert not any("image" in line for line in view[view.index("History:"):])
    assert "Reason:    AlgorithmError: rank 0 on algo-1: ValueError: bad batch size" in view
    assert view[-1] == "Logs:      meshtrain logs bad-one [--rank N] [-f]"
    assert main(["logs", "bad-one", "--follow"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "[algo-1] about to fail" in out
    assert out[-1] == ("===== Job Failed: AlgorithmError: rank 0 on algo-1: ValueError: bad "
                       "batch size =====")
    assert main(["stop", "good-one"]) == 0
    assert "already ended (Completed)" in capsys.readouterr().out
    for command, meant in ((["status", "good-on"], "good-one"), (["describe", "goodone"],
                           "good-one"), (["logs", "bad-on"], "bad-one"), (["stop", "bad_one"],
                           "bad-one"), (["rm", "bad-on"], "bad-one")):
        assert main(command) == 2
        assert capsys.readouterr().err.rstrip().endswith(f"Did you mean '{meant}'?"), command

    assert main(["prune", "--dry-run"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["would remove bad-one (Failed)",
                                                            "would remove good-one (Completed)"]
    assert main(["prune", "--older-than", "1"]) == 0  # both ended seconds ago: kept
    assert capsys.readouterr().out.strip() == "nothing to prune"
    assert main(["rm", "good-one"]) == 0
    assert capsys.readouterr().out.strip() == "removed good-one"
    assert not (home / "jobs" / "good-one").exists() and (home / "jobs" / "bad-one").exists()
    assert main(["prune"]) == 0
    assert capsys.readouterr().out.strip() == "removed bad-one (Failed)"
    assert main(["list"]) == 0
    assert capsys.readouterr().out.strip() == f"no jobs under {home}/jobs"


def test_rm_refuses_a_running_job(home, scripts, capsys):
    assert main(["run", str(scripts / "sleep.py"), "--job-name", "busy", "--no-wait"]) == 0
    capsys.readouterr()
    try:
        assert main(["rm", "busy"]) == 2
        assert capsys.readouterr().err.strip() == (
            "meshtrain: job busy is still running: stop it first (`meshtrain stop busy`), then "
            "remove it.")
        assert (home / "jobs" / "busy" / "spec.json").exists()
    finally:
        assert main(["stop", "busy"]) == 0
