"""The replica-group policy written once (meshtrain.backends.hosts.ft_coordinator), which local
jobs (ft_run.py) and Slurm (ft_submit.py, ft_group.py) follow: budget, the end, the outcome and
the lines, from hand-made records (no process)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from meshtrain import Estimator
from meshtrain.backends.hosts import ft_coordinator
from meshtrain.backends.hosts.ft_coordinator import (
    DONE,
    LOST,
    STOPPED,
    ReplicaGroupCoordinator,
    coordination_dir,
    may_restart,
)
from meshtrain.backends.hosts.layout import JobDirectory, prepare_host
from meshtrain.contract.fault_tolerance import (
    DEFAULT_REPLICA_GROUP_RESTARTS,
    FINISHED,
    SUPERSEDED,
    write_marker,
)


def _coordinator(tmp_path: Path, **torch_distributed) -> ReplicaGroupCoordinator:
    (tmp_path / "src").mkdir(parents=True, exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("print('train')\n")
    spec = Estimator("train.py", source_dir=str(tmp_path / "src"), instance_count=2,
                     distribution={
                         "torch_distributed": {"enabled": True, **torch_distributed,
                                               "fault_tolerance": {"replica_groups": 2}},
                         "smdistributed": {"modelparallel": {
                             "enabled": True, "parameters": {"hybrid_shard_degree": 1}}},
                     }).build_spec(None, "ft")
    job_dir = JobDirectory(tmp_path / "job")
    job_dir.root.mkdir()
    job_dir.spec_file.write_text(spec.to_json())
    job_dir.write_status(TrainingJobStatus="InProgress")
    for host in spec.hosts:
        prepare_host(spec, job_dir, host)
    return ReplicaGroupCoordinator(spec, job_dir)


def _steps(coordinator: ReplicaGroupCoordinator, group: int, count: int) -> None:
    folder = coordinator.job_dir.host_paths(f"algo-{group + 1}").output_data_dir / (
        "fault_tolerance")
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"replica-{group}.jsonl").open("a") as lines:
        for step in range(count):
            lines.write(json.dumps({"step": step, "replica_group": group, "participants": [0, 1],
                                    "committed": True, "time": 1000.0 + step}) + "\n")


def test_a_fault_tolerant_job_gets_a_restart_budget_by_default(tmp_path):
    assert _coordinator(tmp_path).budget == DEFAULT_REPLICA_GROUP_RESTARTS == 3
    assert _coordinator(tmp_path / "given", max_restarts=0).budget == 0  # it still overrides


def test_a_group_restarts_within_its_budget_never_after_a_finish_or_a_stop():
    assert may_restart(0, 1, peer_finished=False)
    assert not may_restart(1, 1, peer_finished=False)  # budget spent
    assert not may_restart(0, 3, peer_finished=True)  # alone it would find no peer
    assert not may_restart(0, 3, peer_finished=False, stopping=True)


def test_the_outcome_completed_when_a_group_finished_failed_when_every_group_was_lost(tmp_path):
    coordinator = _coordinator(tmp_path)
    first, second = coordinator.groups
    first.state, first.reason = LOST, "AlgorithmError: rank 1 died"
    second.state, second.reason = LOST, "NCCL timeout"
    status, reason = coordinator.outcome()
    assert status == "Failed" and reason == "every replica group failed; the last: NCCL timeout"
    assert coordinator.outcome("StopRequested: stopped")[0] == "Stopped"
    second.state = "running"
    coordinator.on_exit_zero(second)
    assert second.state == DONE and coordinator.outcome() == ("Completed", None)
    assert coordinator.model_hosts() == ["algo-2"]


def test_a_group_that_stopped_for_a_finished_peer_did_not_finish(tmp_path):
    coordinator = _coordinator(tmp_path)
    write_marker(coordination_dir(coordinator.job_dir), SUPERSEDED, 1,
                 {"finished_group": 0, "attempt": 1})
    coordinator.on_exit_zero(coordinator.groups[1])
    assert coordinator.groups[1].state == STOPPED and coordinator.first_done is None
    log = coordinator.job_dir.log_file.read_text()
    assert log == ("[meshtrain] replica group 1 stopped: replica group 0 finished the job "
                   "first\n")


def test_a_group_behind_the_finished_one_is_stopped_at_once_one_level_gets_the_window(
        tmp_path, monkeypatch):
    coordinator = _coordinator(tmp_path)
    _steps(coordinator, 0, 10)
    write_marker(coordination_dir(coordinator.job_dir), FINISHED, 0, {"committed_steps": 10})
    _steps(coordinator, 1, 7)
    coordinator.on_exit_zero(coordinator.groups[0])
    assert coordinator.to_stop() == [coordinator.groups[1]]  # 7 of 10 steps: at once
    assert ("replica group 1 stopped: replica group 0 finished the job (it had committed 7 of "
            "the job's 10 steps)") in coordinator.job_dir.log_file.read_text()
    _steps(coordinator, 1, 10)  # now it has committed the last step too
    assert coordinator.to_stop() == []  # it gets the window to exit by itself
    monkeypatch.setattr(ft_coordinator.time, "monotonic",
                        lambda: coordinator.first_done_at + ft_coordinator.FINISH_WINDOW_SECONDS)
    assert coordinator.to_stop() == [coordinator.groups[1]]


def test_each_event_is_one_line(tmp_path):
    coordinator = _coordinator(tmp_path, max_restarts=1)
    group = coordinator.groups[1]
    event = coordinator.on_failure(group, "AlgorithmError: rank 3 on algo-2: killed by SIGKILL\n"
                                          "details", time.time(), restarted=True)
    assert group.attempt == 2 and "RestartedAt" in event
    coordinator.on_failure(group, "AlgorithmError: again", time.time(), restarted=False)
    assert group.state == LOST
    assert coordinator.job_dir.log_file.read_text().splitlines() == [
        "[meshtrain] replica group 1 (algo-2) failed: AlgorithmError: rank 3 on algo-2: killed "
        "by SIGKILL; restarting only its hosts (restart 1 of 1); the other groups train on",
        "[meshtrain] replica group 1 failed: AlgorithmError: again; not restarted (its 1 "
        "restarts are spent); the other groups train on without it"]


@pytest.mark.parametrize("kind", ["local", "slurm"])
def test_local_and_slurm_follow_the_one_coordinator(kind):
    """No second copy of the policy: both backends' fault-tolerant modules use the
    coordinator's rules and constants, and define none of their own."""
    root = Path(ft_coordinator.__file__).parents[1]
    files = {"local": [root / "hosts" / "ft_run.py"],
             "slurm": [root / "slurm" / "ft_submit.py", root / "slurm" / "ft_group.py"]}[kind]
    text = "\n".join(path.read_text() for path in files)
    assert "ft_coordinator import" in text
    for own in ("FINISH_WINDOW_SECONDS =", "LOG_PREFIX =", "def job_outcome", "def _outcome",
                "restarting only its hosts"):
        assert own not in text, own
