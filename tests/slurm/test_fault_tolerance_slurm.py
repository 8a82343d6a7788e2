"""Fault-tolerant replica groups on Slurm (issue 36): one sbatch job per replica group, the
lighthouse run by the submitting side.

One job on the tier's real two-node cluster: 2 hosts x 2 processes, hybrid_shard_degree 2,
``fault_tolerance: {"replica_groups": 2}``, the e2e's plain script (scripts/ft_hsdp_train.py,
no checkpoint), each group on a node of its own. Group 1 fails twice: one of its ranks is
SIGKILLed (its batch step restarts only its hosts, inside its own Slurm job), then its node dies
(slurmd and every process on it SIGKILLed, slurmd back 3 s later: its Slurm job runs again,
requeued). Group 0 trains on through both, group 1 heals from it each time and the job
completes. The pure rules (a group job's end, the job's outcome, a group's script, a dead
submitting process) are checked without the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ci_guards import import_or_skip
from ft_jobs import GROUPS, lead_example_distribution, rank_of_group, wait_for

from meshtrain import Estimator
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.processes import pids_of_job
from meshtrain.backends.slurm.ft_submit import group_ended
from meshtrain.backends.slurm.script import SlurmOptions, render_group
from meshtrain.contract import env as names

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess, pytest.mark.e2e]

SCRIPTS = Path(__file__).resolve().parents[1] / "e2e" / "scripts"  # ft_hsdp_train.py
KILL_AFTER_STEPS = 3
STEPS_AFTER_REJOIN = 3
DISTRIBUTION = lead_example_distribution(max_restarts=1)


@dataclass
class Run:
    job: Any
    killed_at: float
    lighthouse_pid: int
    slurm_job_ids: list[str]
    node: str = ""
    node_killed_at: float = 0.0
    restarts: dict[str, int] | None = None

    def records(self, group: int) -> list[dict[str, Any]]:
        path = (self.job.job_dir.host_paths(f"algo-{group + 1}").output_data_dir
                / "fault_tolerance" / f"replica-{group}.jsonl")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def events(self) -> list[dict[str, Any]]:
        return self.job.job_dir.read_status().get("FaultToleranceEvents", [])

    def rejoined(self, failure: int) -> dict[str, Any] | None:
        """Group 1's first committed step with itself in the quorum after its restart from
        failure `failure` (0: the rank, 1: the node)."""
        events = self.events()
        if len(events) <= failure or "RestartedAt" not in events[failure]:
            return None
        back = [r for r in self.records(1) if r["committed"] and 1 in r["participants"]
                and r["time"] > events[failure]["RestartedAt"]]
        return min(back, key=lambda r: r["step"]) if back else None


@pytest.fixture(scope="module")
def run(slurm_cluster, tmp_path_factory) -> Run:
    import_or_skip("torch")
    import_or_skip("torchft")  # meshtrain[ft]: missing, a skip here and a failure under CI
    home = tmp_path_factory.mktemp("ft_slurm")
    shared = home / "shared"
    shared.mkdir()
    (home / "jobs").mkdir()
    job = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_type="slurm",
                    instance_count=2, jobs_dir=str(home / "jobs"), distribution=DISTRIBUTION,
                    max_run=900, sbatch_args=["--exclusive"],  # a node per group, as on GPUs
                    environment={"FT_TEST_DIR": str(shared), "OMP_NUM_THREADS": "1"}).fit(
        wait=False, job_name="ft-slurm")
    try:
        probe = Run(job, 0.0, 0, [])
        wait_for("group 1 to commit steps", lambda: sum(
            r["committed"] for r in probe.records(1)) >= KILL_AFTER_STEPS, job)
        pid = rank_of_group(job.token, 1, 1)
        assert pid is not None, "no rank 1 of replica group 1 among the job's processes"
        layout = job.job_dir.read_status()["FaultToleranceLayout"]
        killed = Run(job, time.time(), layout["LighthousePid"], list(job.slurm_job_ids))
        os.kill(pid, signal.SIGKILL)  # 1: a rank dies; the group's step restarts in its job
        wait_for("group 1 to rejoin after its rank died", lambda: killed.rejoined(0), job)
        killed.node = (job.job_dir.root / "nodes" / "algo-2").read_text().strip()
        killed.node_killed_at = time.time()
        slurm_cluster.kill_node(killed.node)  # 2: its node dies; Slurm runs its job again
        time.sleep(3)
        slurm_cluster.start_node(killed.node)
        wait_for("group 1 to rejoin after its node died", lambda: killed.rejoined(1), job)
        killed.restarts = {i: slurm_cluster.run("scontrol", "show", "job", i).count(
            "Restarts=1") for i in killed.slurm_job_ids}
        last = max(r["step"] for r in killed.records(0))
        (shared / "stop-at").write_text(str(last + STEPS_AFTER_REJOIN))
        job.wait(logs=False)
    finally:
        if job.job_dir.read_status()["TrainingJobStatus"] == "InProgress":
            job.stop()
    return killed


def test_the_job_completes_and_nothing_outlives_it(run):
    description = run.job.describe()
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    assert pids_of_job(run.job.token) == []
    assert not Path(f"/proc/{run.lighthouse_pid}").exists() or Path(
        f"/proc/{run.lighthouse_pid}/stat").read_text().split()[2] == "Z"


def test_one_slurm_job_per_replica_group_with_its_environment(run):
    assert len(run.slurm_job_ids) == GROUPS and len(set(run.slurm_job_ids)) == GROUPS
    lighthouse = run.job.job_dir.read_status()["FaultToleranceLayout"]["Lighthouse"]
    for group in range(GROUPS):
        text = (run.job.job_dir.root / f"group-{group}.sbatch").read_text()
        assert "#SBATCH --nodes=1\n" in text and "#SBATCH --requeue\n" in text
        assert f"export {names.MESHTRAIN_FT_REPLICA_GROUP}={group}\n" in text
        assert f"export {names.MESHTRAIN_FT_LIGHTHOUSE}={lighthouse}\n" in text
        assert text.rstrip().endswith(f" {group}")  # its batch step runs only its group


def test_only_group_1_was_restarted_in_its_own_slurm_job_then_requeued(run):
    rank, node = run.events()
    assert rank["ReplicaGroup"] == 1 and "SIGKILL" in rank["FailureReason"]
    assert node["ReplicaGroup"] == 1 and "Slurm requeued" in node["FailureReason"]
    hosts = run.job.job_dir.root / "hosts"
    assert (hosts / "algo-2" / "attempts" / "1").is_dir()
    assert not (hosts / "algo-1" / "attempts").exists()
    # one rendezvous per srun of hosts, named <Slurm job>-<run of it>.<step>
    runs = sorted(p.name.split(".")[0] for p in (run.job.job_dir.root / "rendezvous").iterdir())
    group0, group1 = run.slurm_job_ids
    assert runs == sorted([f"{group0}-0", f"{group1}-0", f"{group1}-0", f"{group1}-1"])
    assert run.restarts == {group0: 0, group1: 1}  # Slurm ran only group 1's job again
    assert (run.job.job_dir.root / "nodes" / "algo-1").read_text().strip() != run.node


def test_group_0_keeps_stepping_alone_and_group_1_rejoins_healed(run):
    for failure in (0, 1):
        back = run.rejoined(failure)
        assert back is not None and back["healed"], (failure, run.records(1))
    back = run.rejoined(1)
    alone = [r for r in run.records(0) if r["committed"] and r["participants"] == [0]
             and run.node_killed_at < r["time"] < back["time"]]
    assert len(alone) >= 3, run.records(0)
    assert [r["participants"] for r in run.records(0) if r["committed"]][-1] == [0, 1]


def test_describe_shows_a_recovery_per_failure(run):
    figures = run.job.describe()["FaultTolerance"]
    rank, node = figures["Recoveries"]
    assert rank["ReplicaGroup"] == node["ReplicaGroup"] == 1
    assert rank["Rejoined"] and node["Rejoined"] and node["StepsWithoutIt"] >= 3
    assert 0 < figures["Goodput"] < 1 and figures["LostReplicaGroups"] == []


def test_a_group_job_ends_once_slurm_runs_nothing_more_of_it():
    assert group_ended({"JobState": "RUNNING"}) is None
    assert group_ended({"JobState": "PENDING"}) is None  # requeued: waits for its node
    assert group_ended({"JobState": "NODE_FAIL", "Requeue": "1"}) is None
    assert group_ended({"JobState": "COMPLETED"}) == "COMPLETED"
    assert group_ended({"JobState": "CANCELLED"}) == "CANCELLED"
    assert group_ended({}) == "UNKNOWN"


def test_a_group_script_runs_only_its_group(tmp_path):
    spec = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_type="slurm",
                     instance_count=4, jobs_dir=str(tmp_path), distribution={
                         **DISTRIBUTION, "smdistributed": {"modelparallel": {
                             "enabled": True, "parameters": {"hybrid_shard_degree": 4}}}},
                     ).build_spec(None, "ft")
    text = render_group(spec, JobDirectory(tmp_path / "ft"), "tok", SlurmOptions(partition="p"),
                        1, ("algo-3", "algo-4"), {names.MESHTRAIN_FT_REPLICA_GROUP: "1"})
    assert "#SBATCH --job-name=ft-group-1\n#SBATCH --nodes=2\n" in text
    assert "#SBATCH --partition=p\n" in text and "#SBATCH --requeue\n" in text
    assert text.count("--nodes=") == 1 and text.count("--job-name=") == 1
    assert "export MESHTRAIN_FT_REPLICA_GROUP=1\n" in text
    assert text.rstrip().endswith("meshtrain.backends.slurm.batch " f"{tmp_path / 'ft'} 1")


def test_a_dead_submitting_process_fails_the_job_and_cancels_its_groups(tmp_path, monkeypatch):
    from meshtrain.backends.hosts import job as job_module
    from meshtrain.backends.slurm import handle
    from meshtrain.backends.slurm.groups import write_job_ids

    spec = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_type="slurm",
                     instance_count=2, jobs_dir=str(tmp_path),
                     distribution=DISTRIBUTION).build_spec(None, "ft")
    job_dir = JobDirectory(tmp_path / "ft")
    job_dir.root.mkdir()
    job_dir.spec_file.write_text(spec.to_json())
    job_dir.token_file.write_text("a-token-no-process-carries")
    job_dir.supervisor_pid_file.write_text("999999999")  # no such process
    job_dir.write_status(TrainingJobStatus="InProgress", CreationTime=time.time())
    write_job_ids(job_dir, ["41", "42"])
    cancelled: list[tuple[str, ...]] = []
    monkeypatch.setattr(handle, "run_slurm", lambda *argv: cancelled.append(argv) or "")
    monkeypatch.setattr(job_module, "POLL_SECONDS", 0.01)  # the 3 looks at the dead pid
    description = handle.SlurmTrainingJob("ft", job_dir).describe()
    assert description["TrainingJobStatus"] == "Failed"
    assert "submitting process of this fault-tolerant Slurm job died" in description[
        "FailureReason"]
    assert cancelled == [("scancel", "41"), ("scancel", "42")]
