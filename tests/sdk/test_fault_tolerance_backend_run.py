"""The fault-tolerant supervisor's decisions with real processes and a real lighthouse, cheaply:
each host is a few lines of Python (no torchrun, no torch) that act on their replica group and
attempt, so restarting only the failed group, a group left out once its budget is spent, a job
whose every group failed, and a straggler stopped after another group finished each take a
second or two."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from ci_guards import missing_component

from meshtrain import Estimator
from meshtrain.backends.hosts import ft_coordinator
from meshtrain.backends.hosts.layout import JobDirectory, prepare_host
from meshtrain.backends.hosts.processes import pids_of_job
from meshtrain.backends.hosts.supervisor import HostSupervisor
from meshtrain.contract import env as names


@pytest.fixture(autouse=True)
def _needs_torchft() -> None:
    """The lighthouse is torchft's (meshtrain[ft]); found without importing torch."""
    if importlib.util.find_spec("torchft") is None:
        missing_component("torchft is not installed (meshtrain[ft])")


# A host: says it started, then does what FT_PLAN says for "<group>-<attempt>": ok (exit 0, the
# default), fail (exit 1), wait (exit 0 once group 1's second attempt has started), release (exit
# 0 once the test says so), hang (sleep until stopped), finish (exit 0 after marking its group
# finished with 5 committed steps, as the runtime's rank 0 does), supersede (once group 0 is
# marked finished, mark itself stopped for it and exit 0, as the runtime's rank 0 does).
HOST = """
import os, sys, time
from pathlib import Path
from meshtrain.contract.fault_tolerance import FINISHED, SUPERSEDED, marker_path, write_marker
shared = Path(os.environ["FT_SHARED"])
folder = os.environ["MESHTRAIN_FT_COORDINATION_DIR"]
group, attempt = int(os.environ["MESHTRAIN_FT_REPLICA_GROUP"]), os.environ["MESHTRAIN_ATTEMPT"]
key = f"{group}-{attempt}"
(shared / ("start-" + key)).write_text(os.environ["MESHTRAIN_FT_LIGHTHOUSE"])
action = dict(item.split("=") for item in os.environ["FT_PLAN"].split(",")).get(key, "ok")
if action == "fail":
    sys.exit(1)
if action == "finish":
    write_marker(folder, FINISHED, group, {"committed_steps": 5, "attempt": int(attempt)})
while action == "supersede" and not marker_path(folder, FINISHED, 0).exists():
    time.sleep(0.05)
if action == "supersede":
    write_marker(folder, SUPERSEDED, group, {"finished_group": 0, "attempt": int(attempt)})
while action == "hang" or (action == "wait" and not (shared / "start-1-2").exists()) or (
        action == "release" and not (shared / "release").exists()):
    time.sleep(0.05)
"""


class TinyHosts(HostSupervisor):
    """Every host is HOST above, in a session of its own, with the job's token."""

    plan = ""

    def host_process(self, host: str, attempt: int) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, names.MESHTRAIN_JOB_TOKEN: self.token,
               names.MESHTRAIN_ATTEMPT: str(attempt), "FT_PLAN": self.plan,
               "FT_SHARED": str(self.job_dir.root / "shared"), **self.host_extra_env[host]}
        return [sys.executable, "-c", HOST], env


def _supervisor(tmp_path: Path, plan: str, restarts: int) -> TinyHosts:
    spec = Estimator("train.py", source_dir=str(tmp_path / "src"), instance_count=4, distribution={
        "torch_distributed": {"enabled": True, "max_restarts": restarts,
                              "fault_tolerance": {"replica_groups": 2}},
        "smdistributed": {"modelparallel": {"enabled": True,
                                            "parameters": {"hybrid_shard_degree": 2}}},
    }).build_spec(None, "ft")
    job_dir = JobDirectory(tmp_path / "job")
    (job_dir.root / "shared").mkdir(parents=True)
    job_dir.spec_file.write_text(spec.to_json())
    job_dir.token_file.write_text(f"token-{os.getpid()}-{time.monotonic_ns()}")
    job_dir.write_status(TrainingJobStatus="InProgress", SecondaryStatusTransitions=[])
    for host in spec.hosts:
        prepare_host(spec, job_dir, host)
    supervisor = TinyHosts(job_dir)
    supervisor.plan = plan
    return supervisor


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('train')\n")
    return tmp_path


def _run(supervisor: TinyHosts) -> dict:
    supervisor.run()
    assert pids_of_job(supervisor.token) == []  # hosts and lighthouse: nothing outlives the job
    status = supervisor.job_dir.read_status()
    pid = status["FaultToleranceLayout"]["LighthousePid"]
    assert not Path(f"/proc/{pid}").exists()  # stopped by its pid and reaped
    return status


def _started(supervisor: TinyHosts) -> list[str]:
    return sorted(p.name for p in (supervisor.job_dir.root / "shared").glob("start-*"))


def test_only_the_failed_group_is_restarted(source):
    supervisor = _supervisor(source, "0-1=wait,1-1=fail", restarts=1)
    status = _run(supervisor)
    assert status["TrainingJobStatus"] == "Completed", status.get("FailureReason")
    # 4 hosts, 2 per group: group 0's two hosts started once, group 1's twice
    assert _started(supervisor) == ["start-0-1", "start-1-1", "start-1-2"]
    assert len(list((supervisor.job_dir.root / "hosts").glob("algo-*/attempts/1"))) == 2
    assert not (supervisor.job_dir.root / "hosts" / "algo-1" / "attempts").exists()
    (event,) = status["FaultToleranceEvents"]
    assert event["ReplicaGroup"] == 1 and "RestartedAt" in event
    log = supervisor.job_dir.log_file.read_text()
    assert "replica group 1 (algo-3, algo-4) failed" in log


def test_a_group_with_its_budget_spent_is_left_out_and_the_others_finish(source):
    supervisor = _supervisor(source, "0-1=release,1-1=fail,1-2=fail", restarts=1)

    def release_after_two_failures() -> None:
        deadline = time.monotonic() + 60
        while len(supervisor.job_dir.read_status().get("FaultToleranceEvents", [])) < 2 and (
                time.monotonic() < deadline):
            time.sleep(0.05)
        (supervisor.job_dir.root / "shared" / "release").touch()

    threading.Thread(target=release_after_two_failures, daemon=True).start()
    status = _run(supervisor)
    assert status["TrainingJobStatus"] == "Completed"
    events = status["FaultToleranceEvents"]
    assert [e.get("Lost", False) for e in events] == [False, True]
    assert "not restarted (its 1 restarts are spent)" in supervisor.job_dir.log_file.read_text()


def test_the_job_fails_when_every_group_failed(source):
    supervisor = _supervisor(source, "0-1=fail,1-1=fail", restarts=0)
    status = _run(supervisor)
    assert status["TrainingJobStatus"] == "Failed"
    assert status["FailureReason"].startswith("every replica group failed")


def test_a_group_that_committed_the_last_step_gets_the_window_to_exit(source, monkeypatch):
    monkeypatch.setattr(ft_coordinator, "FINISH_WINDOW_SECONDS", 1.0)
    supervisor = _supervisor(source, "1-1=hang", restarts=1)
    status = _run(supervisor)
    assert status["TrainingJobStatus"] == "Completed"
    assert ("replica group 1 stopped: replica group 0 finished the job (it still ran 1 s after)"
            in supervisor.job_dir.log_file.read_text())
    assert status.get("FaultToleranceEvents", []) == []  # a stop is not a failure to restart


def test_a_group_behind_the_finished_one_is_stopped_at_once(source):
    """Group 0 finishes with 5 committed steps, group 1 had committed none: it is stopped when
    group 0's hosts exit, not after the finish window."""
    supervisor = _supervisor(source, "0-1=finish,1-1=hang", restarts=1)
    started = time.monotonic()
    status = _run(supervisor)
    assert time.monotonic() - started < ft_coordinator.FINISH_WINDOW_SECONDS
    assert status["TrainingJobStatus"] == "Completed"
    log = supervisor.job_dir.log_file.read_text()
    assert ("replica group 1 stopped: replica group 0 finished the job (it had committed 0 of "
            "the job's 5 steps)") in log
    assert status["FaultTolerance"]["FinishedReplicaGroup"] == 0
    assert status["FaultTolerance"]["ModelArtifactsFrom"] == ["algo-1", "algo-2"]


def test_a_group_that_stopped_itself_for_a_finished_peer_is_not_the_one_that_finished(source):
    """Group 1's ranks stop themselves once group 0 finished (exit 0, a superseded marker):
    the job is group 0's, whatever order the hosts exit in; the model is group 0's."""
    supervisor = _supervisor(source, "0-1=finish,1-1=supersede", restarts=1)
    for host, group in (("algo-1", 0), ("algo-3", 1)):
        (supervisor.job_dir.host_paths(host).model_dir / "model.txt").write_text(host)
        folder = supervisor.job_dir.host_paths(host).output_data_dir / "fault_tolerance"
        folder.mkdir(parents=True)  # both took part in the job's 5 steps, as in a real job
        (folder / f"replica-{group}.jsonl").write_text("".join(
            json.dumps({"step": step, "replica_group": group, "participants": [0, 1],
                        "committed": True, "time": 1.0 + step}) + "\n" for step in range(5)))
    status = _run(supervisor)
    assert status["TrainingJobStatus"] == "Completed"
    log = supervisor.job_dir.log_file.read_text()
    assert "replica group 1 stopped: replica group 0 finished the job first" in log
    assert "replica group 1 finished" not in log
    assert status["FaultTolerance"]["ModelArtifactsFrom"] == ["algo-1", "algo-2"]
    with tarfile.open(supervisor.job_dir.root.parent / "ft" / "output" / "model.tar.gz") as tar:
        assert tar.extractfile("model.txt").read() == b"algo-1"
