"""Issue 42's acceptance, through the Estimator, as a user meets it: the docs' lead example.

One local job, 2 hosts x 2 processes, hybrid_shard_degree 2, ``fault_tolerance:
{"replica_groups": 2}`` and nothing else (no max_restarts), the plain hybrid-sharded script
scripts/ft_hsdp_train.py running a loop of its own counter: 240 steps of about 0.25 s (0.25 s of
"data loading" each). Once group 1 has committed 10 steps the test SIGKILLs one of its ranks and
then only watches: nothing holds, delays or orders the restart. Every check reads the job's own
records (the groups' step lines, the groups' markers, the ranks' step files, status.json,
describe(), the job log) and measures the issue's definitions as given:

- group 1 is restarted and commits a step again within 30 s of the kill;
- group 0 never goes more than 5 s without a committed step, from its last step before the kill
  (failure detection included) until group 1 is back;
- no group steps after another finished: no step of another group began after the first
  finished group's finish (its marker), none is numbered past its last;
- the job Completes; one-process replays, bitwise equal shards and describe() as before.

On a quiet 2-core box (load <= 4) the bounds hold by design: the survivors' pause is the
lighthouse's 2-s heartbeat timeout plus a step, and group 1 joins only once it can step. This
machine is shared, so a run here under a higher load may fail a bound; the lead runs this file
on a quiet box (docs/fault-tolerance.md, "Tests and measured figures").
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from ci_guards import import_or_skip
from ft_jobs import (
    DELAY,
    GROUPS,
    KILL_AT_STEP,
    REJOIN_BOUND,
    SHARD,
    STEPS,
    SURVIVOR_GAP_BOUND,
    back_after,
    lead_example_distribution,
    rank_of_group,
    steps_after_finish,
    survivor_gaps,
    wait_for,
)
from job_privacy import Listener, listeners

from meshtrain import Estimator
from meshtrain.backends.hosts.processes import pids_of_job
from meshtrain.contract.fault_tolerance import FINISHED, SUPERSEDED, read_markers

torch = import_or_skip("torch")
import_or_skip("torchft")  # meshtrain[ft]: missing, a skip here and a failure under CI

SCRIPTS = Path(__file__).parent / "scripts"
_spec = importlib.util.spec_from_file_location("ft_hsdp_train", SCRIPTS / "ft_hsdp_train.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]
DISTRIBUTION = lead_example_distribution()


@dataclass
class Run:
    job: Any
    killed_at: float
    killed_pid: int
    lighthouse_pid: int
    listening: list[Listener] = field(default_factory=list)
    """The job's listening sockets while both groups stepped, and after group 1 rejoined."""

    def data_dir(self, group: int) -> Path:
        return self.job.job_dir.host_paths(f"algo-{group + 1}").output_data_dir

    def records(self, group: int) -> list[dict[str, Any]]:
        path = self.data_dir(group) / "fault_tolerance" / f"replica-{group}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def rank_lines(self, dp_rank: int) -> list[dict[str, Any]]:
        path = self.data_dir(dp_rank // SHARD) / f"ft-steps-dp{dp_rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def events(self) -> list[dict[str, Any]]:
        return self.job.job_dir.read_status().get("FaultToleranceEvents", [])

    def markers(self, kind: str) -> dict[int, dict[str, Any]]:
        return read_markers(self.job.job_dir.root / "fault_tolerance", kind)


def _rejoined(run: Run) -> bool:
    """Group 1 committed a step with itself in the quorum after the kill."""
    return back_after(run.records(1), 1, run.killed_at) is not None


def _in_progress(job: Any) -> bool:
    return job.job_dir.read_status()["TrainingJobStatus"] == "InProgress"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    patch = pytest.MonkeyPatch()
    patch.setenv("OMP_NUM_THREADS", "1")
    home = tmp_path_factory.mktemp("fault_tolerance")
    job = Estimator("ft_hsdp_train.py", source_dir=str(SCRIPTS), instance_count=2,
                    jobs_dir=str(home / "jobs"), distribution=DISTRIBUTION, max_run=900,
                    hyperparameters={"max-steps": STEPS, "delay": DELAY},
                    environment={"FT_TEST_DIR": str(home)}).fit(wait=False, job_name="ft")
    try:
        probe = Run(job, 0.0, 0, 0)
        wait_for(f"group 1 to commit {KILL_AT_STEP} steps", lambda: sum(
            r["committed"] for r in probe.records(1)) >= KILL_AT_STEP, job)
        listening = listeners(pids_of_job(job.token))  # lighthouse, stores, torchft, gloo
        pid = rank_of_group(job.token, 1, 1)
        assert pid is not None, "no rank 1 of replica group 1 among the job's processes"
        lighthouse = job.job_dir.read_status()["FaultToleranceLayout"]["LighthousePid"]
        killed = Run(job, time.time(), pid, lighthouse, listening)
        os.kill(pid, signal.SIGKILL)
        while not _rejoined(killed) and _in_progress(job):  # watching, not holding
            time.sleep(0.2)
        if _rejoined(killed):  # its new ranks' sockets too (a rejoin is checked below)
            killed.listening += listeners(pids_of_job(job.token))
        job.wait(logs=False)
    finally:
        if job.job_dir.read_status()["TrainingJobStatus"] == "InProgress":
            job.stop()
        patch.undo()
    return killed


def _committed(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in records if r["committed"]}


def _back(run: Run) -> dict[str, Any]:
    """Group 1's first committed step after the kill (with itself in the quorum)."""
    back = back_after(run.records(1), 1, run.killed_at)
    assert back, f"group 1 never stepped again\n{run.job.job_dir.log_file.read_text()[-4000:]}"
    return back


def test_the_job_completes_and_no_process_outlives_it(run):
    description = run.job.describe()
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    assert pids_of_job(run.job.token) == []
    assert not Path(f"/proc/{run.lighthouse_pid}").exists() or Path(
        f"/proc/{run.lighthouse_pid}/stat").read_text().split()[2] == "Z"


def test_no_socket_of_the_job_listens_beyond_loopback(run):
    """Issue 43: every service of a local fault-tolerant job (torchft's lighthouse, each group's
    rendezvous store, Manager server and healing transport, gloo's pairs) listens on loopback,
    before the kill and after the rejoin."""
    assert run.lighthouse_pid in {s.pid for s in run.listening}
    ranks = [s for s in run.listening if s.name.startswith("mt-rank-")]  # torchft and gloo
    agents = [s for s in run.listening if "agent_entry" in s.command and s not in ranks]
    assert ranks and agents, run.listening  # the agents: the groups' stores
    assert [s for s in run.listening if not s.loopback] == [], run.listening


def test_the_lead_example_restarts_the_killed_group_by_itself(run):
    (event,) = run.events()
    assert event["ReplicaGroup"] == 1 and "SIGKILL" in event["FailureReason"]
    assert "RestartedAt" in event  # no max_restarts given: the default budget restarted it
    assert run.job.describe()["FaultTolerance"]["RestartsPerGroup"] == 3
    attempts = run.job.job_dir.root / "hosts"
    assert (attempts / "algo-2" / "attempts" / "1").is_dir()
    assert not (attempts / "algo-1" / "attempts").exists()
    log = run.job.job_dir.log_file.read_text()
    assert "replica group 1 (algo-2) failed" in log and "restarting only its hosts" in log


def test_group_1_steps_again_within_30_s_of_the_kill(run):
    back = _back(run)
    assert back["time"] - run.killed_at <= REJOIN_BOUND, back["time"] - run.killed_at
    assert back["healed"] and back["step"] > KILL_AT_STEP  # from its live peer


def test_group_0_never_goes_5_s_without_a_committed_step_until_group_1_is_back(run):
    gaps = survivor_gaps(run.records(0), run.killed_at, _back(run)["time"])
    assert gaps and max(gaps) <= SURVIVOR_GAP_BOUND, max(gaps, default=None)
    (recovery,) = run.job.describe()["FaultTolerance"]["Recoveries"]
    assert recovery["SurvivorGapSeconds"] <= max(gaps) + 1e-3  # what describe() measures


def test_no_group_steps_after_another_finished(run):
    finished = run.markers(FINISHED)
    assert finished, "no group marked itself finished"
    first, late = steps_after_finish({g: run.records(g) for g in range(GROUPS)}, finished)
    assert late == []
    figures = run.job.describe()["FaultTolerance"]
    assert figures["FinishedReplicaGroup"] == first
    assert figures["ModelArtifactsFrom"] == [f"algo-{first + 1}"]


def test_the_group_whose_loop_was_behind_was_stopped_and_it_says_why(run):
    """Group 1's loop restarted from its top, so it had iterations left when group 0's ended:
    it stopped (itself, exit 0, once it met a quorum without group 0; or by the supervisor, as
    it had not committed the job's last step) instead of training on alone; one line says so."""
    log = run.job.job_dir.log_file.read_text()
    assert log.count("replica group 1 stopped: replica group 0 finished the job") == 1, log[-3000:]
    assert "replica group 1 finished" not in log
    for superseded in run.markers(SUPERSEDED).values():
        assert superseded["replica_group"] == 1 and superseded["finished_group"] == 0
        assert "replica group 1 stops: replica group 0 finished the job" in log  # its rank 0


def test_same_shard_coordinates_hold_bitwise_equal_state_once_healed(run):
    back = _back(run)
    for shard in range(SHARD):
        ours = {line["committed_after"]: line["digest"] for line in run.rank_lines(shard)}
        theirs = {line["committed_after"]: line["digest"]
                  for line in run.rank_lines(SHARD + shard) if line["step"] >= back["step"]}
        shared = sorted(set(ours) & set(theirs))
        assert len(shared) >= 3, (shard, shared)
        assert [ours[s] for s in shared] == [theirs[s] for s in shared], shard


def test_describe_shows_one_recovery_and_the_goodput(run):
    figures = run.job.describe()["FaultTolerance"]
    (recovery,) = figures["Recoveries"]
    assert recovery["Rejoined"] and recovery["DownSeconds"] > 0
    assert 0.5 < figures["Goodput"] < 1.0 and figures["ReplicaGroups"] == GROUPS
    measured = figures["Measured"]
    assert measured["GroupRestartSeconds"] > 0 and measured["HealSeconds"] is not None
    assert "ft:recoveries=1.0" in run.job.job_dir.log_file.read_text()  # the progress line


def test_torchft_says_its_part_in_a_debug_file_not_the_job_log(run):
    log = run.job.job_dir.log_file.read_text().splitlines()
    torchft = [line for line in log if "[torchft" in line or "GET /checkpoint" in line]
    assert len(torchft) <= 0.05 * len(log), (len(torchft), len(log))
    debug = (run.job.job_dir.root / "fault_tolerance" / "torchft-group-0.log").read_text()
    assert "[INFO] [torchft::manager]" in debug
    assert list(run.job.debug_log_lines())


def _data_index(run: Run, group: int) -> dict[int, int]:
    """For each step group `group` committed, the loop index (rows) its ranks trained on."""
    found: dict[int, int] = {}
    for shard in range(SHARD):
        for line in run.rank_lines(group * SHARD + shard):
            if line["committed_after"] == line["step"] + 1:
                assert found.setdefault(line["step"], line["index"]) == line["index"]
    return found


def test_one_process_replays_every_loss_as_the_log_says_the_steps_ran(run):
    """Before the failure every group took part: the replay is then the uninterrupted
    one-process run of the same model, seed and global batch; after it, each step averages over
    the groups its record lists, on the rows each group's ranks say they used."""
    records = {g: _committed(run.records(g)) for g in range(GROUPS)}
    indexes = {g: _data_index(run, g) for g in range(GROUPS)}
    participants = {s: r["participants"] for g in range(GROUPS) for s, r in records[g].items()}
    torch.manual_seed(script.INIT_SEED)
    model = script.Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=script.LR)
    failure_step = min(s for s, p in participants.items() if p == [0])
    assert all(participants[s] == [0, 1] for s in range(failure_step))
    worst = 0.0
    for step in sorted(participants):
        xs, ys = [], []
        for group in participants[step]:
            rows = [script.batch(group * SHARD + s, indexes[group][step]) for s in range(SHARD)]
            x, y = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
            with torch.no_grad():
                expected = torch.nn.functional.mse_loss(model(x), y).item()
            worst = max(worst, abs(records[group][step]["loss"] - expected))
            xs.append(x)
            ys.append(y)
        loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert worst <= 1e-5, worst
    assert len(participants) > failure_step + 3


def test_readmes_describe_example_reads_this_job(run):
    """README's snippet, run as written, with its Estimator's fit() handing back this job (same
    distribution, the docs' lead example): the calls and the keys it reads are the job's."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (snippet,) = [block for block in re.findall(r"```python\n(.+?)```", readme, re.DOTALL)
                  if 'describe()["FaultTolerance"]' in block]
    given = {}

    class Submitted:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given.update(kwargs)

        def fit(self, wait: bool = True) -> Any:
            assert wait is False
            return run.job

    printed = []
    exec(snippet, {"Estimator": Submitted, "print": lambda *a: printed.append(a)})
    assert given["distribution"] == DISTRIBUTION and given["instance_count"] == 2
    ((goodput, recoveries),) = printed
    assert goodput == run.job.describe()["FaultTolerance"]["Goodput"] and len(recoveries) == 1
