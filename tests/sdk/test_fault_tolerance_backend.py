"""The backend side of fault tolerance without a job: replica groups, the hosts' environment and
torchrun world, the lighthouse started and stopped by its pid, the job's figures from step
records, and the targets that refuse it before anything exists. A real job, whose killed group
alone is restarted, is tests/e2e/test_fault_tolerance_job.py."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from pathlib import Path

import pytest
from ci_guards import missing_component

from meshtrain import ConfigError, Estimator
from meshtrain.backends.hosts.ft_logs import is_torchft_debug
from meshtrain.backends.hosts.ft_metrics import (
    fault_tolerance_summary,
    progress_metrics_line,
    read_step_records,
)
from meshtrain.backends.hosts.lighthouse import Lighthouse, LighthouseError
from meshtrain.backends.hosts.replica_groups import ReplicaGroups, ft_environment
from meshtrain.contract import env as names
from meshtrain.contract.fault_tolerance import FaultTolerance
from meshtrain.progress import ProgressTracker

SCRIPTS = Path(__file__).parents[1] / "e2e" / "scripts"


def _needs_torchft() -> None:
    """The lighthouse is torchft's (meshtrain[ft]); found without importing torch."""
    if importlib.util.find_spec("torchft") is None:
        missing_component("torchft is not installed (meshtrain[ft])")


def _distribution(groups: int = 2, shard: int = 1, per_host: int = 1, **ft) -> dict:
    return {"torch_distributed": {"enabled": True, "processes_per_host": per_host,
                                  "max_restarts": 1,
                                  "fault_tolerance": {"replica_groups": groups, **ft}},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": shard}}}}


# --- grouping and environment --------------------------------------------------------------

def test_hosts_are_grouped_in_number_order():
    hosts = [f"algo-{i}" for i in (10, 2, 1, 11, 3, 12, 4, 5, 6, 7, 8, 9)]
    layout = ReplicaGroups.of(hosts, 3)
    assert layout.groups == (("algo-1", "algo-2", "algo-3", "algo-4"),
                             ("algo-5", "algo-6", "algo-7", "algo-8"),
                             ("algo-9", "algo-10", "algo-11", "algo-12"))
    assert layout.group_of("algo-10") == 2 and layout.first_host(1) == "algo-5"
    with pytest.raises(ConfigError, match="replica_groups=3 does not divide instance_count=4"):
        ReplicaGroups.of(["algo-1", "algo-2", "algo-3", "algo-4"], 3)


def test_each_host_is_told_its_group_the_lighthouse_and_the_settings():
    env = ft_environment(1, FaultTolerance(replica_groups=2, min_replica_groups=2),
                         "http://127.0.0.1:5", Path("/jobs/ft/fault_tolerance"))
    assert env[names.MESHTRAIN_FT_COORDINATION_DIR] == "/jobs/ft/fault_tolerance"
    assert env[names.MESHTRAIN_FT_REPLICA_GROUP] == "1"
    assert env[names.MESHTRAIN_FT_REPLICA_GROUPS] == "2"
    assert env[names.MESHTRAIN_FT_LIGHTHOUSE] == "http://127.0.0.1:5"
    assert env["MESHTRAIN_FT_MIN_REPLICA_GROUPS"] == "2"


def test_a_host_runs_torchrun_over_its_group_only(tmp_path, monkeypatch):
    """The bootstrap's torchrun world is the replica group: its hosts, its node rank, its
    master (the group's first host when the backend names none)."""
    from meshtrain.contract.paths import OptMLPaths
    from meshtrain_runtime.host.bootstrap import build_command
    from meshtrain_runtime.host.contract import HostContract
    paths = OptMLPaths(tmp_path)
    hosts = [f"algo-{i}" for i in range(1, 5)]
    contract = HostContract(paths, {}, {}, {"sagemaker_pytorch_ddp_enabled": False},
                            {"current_host": "algo-4", "hosts": hosts}, {}, num_gpus=0)
    monkeypatch.setattr(HostContract, "torch_distributed", property(lambda self: True))
    monkeypatch.setattr(HostContract, "processes_per_host", property(lambda self: 2))
    for key in (names.MESHTRAIN_MASTER_ADDR, names.MESHTRAIN_MASTER_PORT, "PET_RDZV_BACKEND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(names.MESHTRAIN_FT_REPLICA_GROUP, "1")
    monkeypatch.setenv(names.MESHTRAIN_FT_REPLICA_GROUPS, "2")
    command = build_command(contract, tmp_path / "train.py", tmp_path / "logs")
    assert contract.world_hosts == ["algo-3", "algo-4"]
    for flag, value in (("--nnodes", "2"), ("--node-rank", "1"), ("--master-addr", "algo-3")):
        assert command[command.index(flag) + 1] == value, command
    monkeypatch.delenv(names.MESHTRAIN_FT_REPLICA_GROUP)
    command = build_command(contract, tmp_path / "train.py", tmp_path / "logs")
    assert command[command.index("--nnodes") + 1] == "4"
    assert command[command.index("--node-rank") + 1] == "3"


# --- the job's figures ------------------------------------------------------------------

def _records(tmp_path: Path) -> list[dict]:
    """Group 0 steps 0-9; group 1 takes part in 0-3, dies at t=3.5, is back from step 7."""
    folder = tmp_path / "fault_tolerance"
    folder.mkdir()
    lines = {0: [], 1: []}
    for step in range(10):
        both = step <= 3 or step >= 7
        participants = [0, 1] if both else [0]
        for group in participants:
            lines[group].append(json.dumps({
                "step": step, "replica_group": group, "participants": participants,
                "committed": True, "time": float(step), "healed": group == 1 and step == 7,
                "loss": 1.0}))
    lines[1].append('{"step": 8, "replica_')  # a line cut by the kill: skipped
    for group, text in lines.items():
        (folder / f"replica-{group}.jsonl").write_text("\n".join(text) + "\n")
    return read_step_records([tmp_path])


def test_goodput_and_one_recovery_from_the_records(tmp_path):
    records = _records(tmp_path)
    events = [{"ReplicaGroup": 1, "FailedAt": 3.5, "RestartedAt": 4.5}]
    summary = fault_tolerance_summary(records, events, 2)
    assert summary["CommittedSteps"] == 10 and summary["ReplicaSteps"] == 17
    assert summary["Goodput"] == pytest.approx(17 / 20)
    (recovery,) = summary["Recoveries"]
    assert recovery["ReplicaGroup"] == 1 and recovery["StepsWithoutIt"] == 3
    assert recovery["DownSeconds"] == pytest.approx(7.0 - 3.5)
    assert recovery["RejoinSecondsAfterRestart"] == pytest.approx(7.0 - 4.5)
    assert recovery["RejoinedAtStep"] == 7 and summary["LiveReplicaGroups"] == 2


def test_a_group_that_never_came_back_counts_every_step_after_it(tmp_path):
    records = [r for r in _records(tmp_path) if not (r["replica_group"] == 1 and r["step"] >= 7)]
    for record in records:
        if record["step"] >= 7:
            record["participants"] = [0]
    summary = fault_tolerance_summary(records, [{"ReplicaGroup": 1, "FailedAt": 3.5,
                                                 "Lost": True}], 2)
    (recovery,) = summary["Recoveries"]
    assert not recovery["Rejoined"] and recovery["DownSeconds"] is None
    assert recovery["StepsWithoutIt"] == 6 and summary["LostReplicaGroups"] == [1]
    assert summary["LiveReplicaGroups"] == 1
    assert summary["Goodput"] == pytest.approx(14 / 20)


def test_the_progress_line_shows_replicas_goodput_and_recoveries(tmp_path):
    summary = fault_tolerance_summary(_records(tmp_path), [
        {"ReplicaGroup": 1, "FailedAt": 3.5, "RestartedAt": 4.5}], 2)
    tracker = ProgressTracker(20)
    tracker.feed("[meshtrain metric] train:loss=0.5 step=9")
    assert tracker.feed(progress_metrics_line(summary))
    assert "step 9/20 · loss 0.5000 · replicas 2/2 · goodput 85.0% · 1 recovery" in (
        tracker.progress().summary())


# --- the lighthouse ---------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_the_lighthouse_listens_and_is_stopped_by_its_pid(tmp_path):
    _needs_torchft()
    lighthouse = Lighthouse(tmp_path / "lighthouse.log")
    address = lighthouse.start()
    try:
        host, port = address.removeprefix("http://").rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        assert _pid_alive(lighthouse.pid)
    finally:
        lighthouse.stop()
    assert not _pid_alive(lighthouse.pid)


def test_a_lighthouse_that_cannot_start_fails_with_its_log(tmp_path):
    _needs_torchft()
    lighthouse = Lighthouse(tmp_path / "lighthouse.log", bind_host="not-an-address")
    with pytest.raises(LighthouseError, match=r"lighthouse exited with code .*its log"):
        lighthouse.start()
    assert not _pid_alive(lighthouse.pid)


# --- targets that do not run it refuse before anything exists ----------------------------

def test_local_docker_refuses_it_before_any_job_directory(tmp_path):
    estimator = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_count=2,
                          instance_type="local_docker", jobs_dir=str(tmp_path / "jobs"),
                          distribution=_distribution())
    with pytest.raises(ConfigError, match="not run on local Docker jobs: its supervisor restarts"):
        estimator.fit(wait=False)
    assert not (tmp_path / "jobs").exists()


def test_kubernetes_refuses_it_as_a_trainjob(tmp_path):
    """A PyTorchJob per group is rendered (tests/sdk/test_kubernetes_fault_tolerance.py)."""
    from meshtrain import kubernetes

    (tmp_path / "train.py").write_text("print('training')\n")
    distribution = _distribution(shard=8, per_host=8)
    distribution["torch_distributed"]["max_restarts"] = 0  # a TrainJob refuses it on its own
    estimator = Estimator("train.py", source_dir=str(tmp_path), instance_count=2,
                          instance_type="ml.p4d.24xlarge", image_uri="meshtrain:test",
                          distribution=distribution)
    with pytest.raises(ConfigError, match="not run on Kubernetes as a TrainJob"):
        kubernetes.render_all(estimator, job_name="ft", kind="TrainJob")


def test_slurm_takes_it_but_refuses_rendering_it_for_sbatch_by_hand(tmp_path):
    from meshtrain.backends.slurm.backend import SlurmBackend

    spec = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_count=2,
                     jobs_dir=str(tmp_path / "jobs"), distribution=_distribution()).build_spec(
        None, "ft")
    backend = SlurmBackend(jobs_dir=tmp_path / "jobs")
    backend._check_fault_tolerance(spec)  # run: tests/slurm/test_fault_tolerance_slurm.py
    with pytest.raises(ConfigError, match="cannot be rendered for sbatch by hand"):
        backend.render_job(spec)
    assert not (tmp_path / "jobs").exists()


def test_a_failed_group_is_not_live_before_the_next_step_says_so(tmp_path):
    records = [r for r in _records(tmp_path) if r["step"] <= 3]  # both took part in step 3
    summary = fault_tolerance_summary(records, [{"ReplicaGroup": 1, "FailedAt": 3.5,
                                                 "RestartedAt": 4.0}], 2)
    assert summary["LiveReplicaGroups"] == 1 and summary["Goodput"] == 1.0


@pytest.mark.parametrize(("line", "debug"), [
    (b"[algo-2 rank 0] 2026-11-28T17:03:06.189 [INFO] [torchft::manager] - [Replica "
     b"meshtrain_ft_1] Finished quorum for group_rank 1\n", True),
    (b"[algo-1 rank 0] 2026-11-28T17:08:34.973[algo-1 rank 0]  [INFO] [torchft::manager] - "
     b"[Replica meshtrain_ft_0] Finished quorum\n", True),  # a line torchrun's prefix split
    (b"[algo-1 rank 0] [meshtrain_ft_0:5f3e/0 - step 3] Unable to reset NCCL flight recorder "
     b"recording so traces will be incorrect.\n", True),
    (b'[algo-1 rank 0] ::ffff:127.0.0.1 - - [28/Nov/2026 16:25:38] "GET /checkpoint/0/full '
     b'HTTP/1.1" 200 -\n', True),
    (b"[algo-2 rank 0] 2026-11-28T17:03:06.189 [WARN] [torchft::manager] - quorum failed\n",
     False),  # torchft's warnings and errors stay in the job log
    (b"[algo-2 rank 0] meshtrain: replica group 1 step 219: healed from a peer\n", False),
    (b"[meshtrain] replica group 1 (algo-2) failed: AlgorithmError: ...\n", False),
])
def test_torchfts_debug_lines_are_told_apart(line, debug):
    assert is_torchft_debug(line) is debug


def test_the_measured_times_the_planner_starts_from(tmp_path):
    """Group 1 asks to join at t=6.2 (began) and heals in 0.4 s; group 0 steps every second but
    went from step 3 (t=3) to step 4 at t=5.5 across the failure: a 2.5-s gap, 1.5 s of stall."""
    records = []
    for record in _records(tmp_path):
        if record["replica_group"] == 0 and record["step"] >= 4:
            record = {**record, "time": record["time"] + 1.5}
        if record["replica_group"] == 1 and record["step"] == 7:
            record = {**record, "time": 8.5, "began": 6.2, "quorum_seconds": 0.4}
        records.append(record)
    checkpoints = [{"kind": "write", "seconds": 2.0}, {"kind": "write", "seconds": 4.0},
                   {"kind": "load", "seconds": 1.0}]
    summary = fault_tolerance_summary(
        records, [{"ReplicaGroup": 1, "FailedAt": 3.5, "RestartedAt": 4.5}], 2, checkpoints)
    (recovery,) = summary["Recoveries"]
    assert recovery["SurvivorGapSeconds"] == 2.5  # group 0: t=3 to its first step alone, 5.5
    assert recovery["RestartSeconds"] == pytest.approx(2.7) and recovery["HealSeconds"] == 0.4
    assert summary["Measured"] == {
        "GroupRestartSeconds": 2.7, "HealSeconds": 0.4, "StallSeconds": 1.5,
        "StepSeconds": 1.0, "CheckpointWriteSeconds": 3.0, "CheckpointLoadSeconds": 1.0}
