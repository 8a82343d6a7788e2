"""Issue 42's acceptance at length, through the Estimator: 2 hosts x 2 processes, hybrid 2, 2
replica groups, the lead example's distribution (no max_restarts).

- A 600-step job with one failure (scripts/ft_step_train.py, a loop by the job's step,
  ``fault.step_to_run()``; one rank of group 1 SIGKILLed at step 50), while a second 2-process
  job (scripts/busy_pair.py) keeps the cores busy beside it until group 1 is back (it must
  run through the failure and the rejoin, not the whole job): group 1 rejoins within 60 s, the
  job commits exactly 600 steps, and torchft's lines are at most 5 % of its log.
- A job that loses every group (scripts/ft_loader_train.py, a ``for inputs, targets in
  loader`` script that saves model, optimizer and loader every 10 steps and loads the latest
  checkpoint at its start; every rank SIGKILLed after its checkpoint of step 10 and 15
  committed steps) resumes from that coordinated checkpoint: each step's checkpoint was written
  by one group and holds the loader at its step, both groups restart by themselves and begin
  again together at its step, every logged loss is the uninterrupted one-process run's within
  1e-5, and the loader goes on from the checkpoint's position: the run reads every sample of
  its 40 global batches once, none twice, none skipped (issue 40's exact resume, under fault
  tolerance).

Nothing holds, delays or orders a restart; the checks read the jobs' own records.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ci_guards import import_or_skip
from ft_jobs import (
    GROUPS,
    SHARD,
    back_after,
    job_script,
    lead_example_distribution,
    loader_slice,
    rank_of_group,
    replay_start,
    wait_for,
)

from meshtrain import Estimator
from meshtrain.backends.hosts.processes import pids_of_job, rank_pids_of_job

torch = import_or_skip("torch")
import_or_skip("torchft")  # meshtrain[ft]: missing, a skip here and a failure under CI

SCRIPTS = Path(__file__).parent / "scripts"
CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus"

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]
DISTRIBUTION = lead_example_distribution()
LONG_STEPS, KILL_AT_STEP, BESIDE_REJOIN_BOUND = 600, 50, 60.0
RESUME_STEPS, CHECKPOINT_EVERY, LOSE_ALL_AFTER = 40, 10, 15
GLOBAL_BATCH, SEQ_LEN = 8, 16  # the loader job's (scripts/ft_loader_train.py's defaults)


def _records(job: Any, group: int) -> list[dict[str, Any]]:
    path = (job.job_dir.host_paths(f"algo-{group + 1}").output_data_dir / "fault_tolerance"
            / f"replica-{group}.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _job(home: Path, name: str, entry_point: str, hyperparameters: dict[str, Any],
         **fit: Any) -> Any:
    return Estimator(entry_point, source_dir=str(SCRIPTS), instance_count=2,
                     jobs_dir=str(home / "jobs"), distribution=DISTRIBUTION, max_run=900,
                     hyperparameters=hyperparameters,
                     environment={"OMP_NUM_THREADS": "1"}).fit(wait=False, job_name=name, **fit)


# --- 600 steps, one failure, a second job beside it ----------------------------------------

@pytest.fixture(scope="module")
def long_run(tmp_path_factory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("ft_long")
    stop = home / "busy-stop"
    beside = Estimator("busy_pair.py", source_dir=str(SCRIPTS), jobs_dir=str(home / "jobs"),
                       distribution={"torch_distributed": {"enabled": True,
                                                           "processes_per_host": 2}},
                       environment={"BUSY_STOP": str(stop), "OMP_NUM_THREADS": "1"},
                       max_run=900).fit(wait=False, job_name="beside")
    # 550 steps after the kill take > 60 s (~0.13 s a step here), so a rejoin anywhere within
    # the bound is seen before the job ends
    job = _job(home, "ft-long", "ft_step_train.py", {"total-steps": LONG_STEPS, "delay": 0.08})
    try:
        wait_for(f"group 1 to commit {KILL_AT_STEP} steps", lambda: sum(
            r["committed"] for r in _records(job, 1)) >= KILL_AT_STEP, job)
        assert beside.job_dir.read_status()["TrainingJobStatus"] == "InProgress"
        pid = rank_of_group(job.token, 1, 1)
        assert pid is not None, "no rank 1 of replica group 1 among the job's processes"
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        # the job beside is there for the rejoin: once group 1 is back (or the job ended), it
        # ends at its next check, and the rest of the 600 steps run on the cores it freed
        while job.job_dir.read_status()["TrainingJobStatus"] == "InProgress" and back_after(
                _records(job, 1), 1, killed_at) is None:
            time.sleep(0.2)
        stop.touch()
        job.wait(logs=False)
    finally:
        if job.job_dir.read_status()["TrainingJobStatus"] == "InProgress":
            job.stop()
        stop.touch()
        beside.wait(logs=False)
    return {"job": job, "beside": beside, "killed_at": killed_at}


def test_a_600_step_job_with_one_failure_commits_600_steps(long_run):
    job = long_run["job"]
    description = job.describe()
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    figures = description["FaultTolerance"]
    assert figures["CommittedSteps"] == LONG_STEPS
    assert len(figures["Recoveries"]) == 1 and figures["Recoveries"][0]["Rejoined"]
    assert pids_of_job(job.token) == [] and pids_of_job(long_run["beside"].token) == []


def test_beside_a_second_job_the_killed_group_rejoins_within_60_s(long_run):
    job, killed_at = long_run["job"], long_run["killed_at"]
    back = back_after(_records(job, 1), 1, killed_at)
    assert back and back["time"] - killed_at <= BESIDE_REJOIN_BOUND, back
    beside = long_run["beside"].job_dir.read_status()
    # it ran from before the kill until group 1 was back
    assert beside["TrainingStartTime"] < killed_at and beside["TrainingEndTime"] > back["time"]


def test_torchft_lines_are_at_most_5_percent_of_the_job_log(long_run):
    job = long_run["job"]
    log = job.job_dir.log_file.read_text().splitlines()
    torchft = [line for line in log if "torchft" in line or "GET /checkpoint" in line]
    assert len(torchft) <= 0.05 * len(log), (len(torchft), len(log))
    debug = list(job.debug_log_lines())
    assert len(debug) > LONG_STEPS  # torchft's INFO lines are kept, in the debug files
    events = [line for line in log if line.startswith("[meshtrain] replica group")]
    assert any("failed" in line and "restarting only its hosts" in line for line in events)


# --- every group lost, resumed from the coordinated checkpoint -------------------------------

@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Any:
    home = tmp_path_factory.mktemp("ft_resume")
    job = _job(home, "ft-resume", "ft_loader_train.py",
               {"steps": RESUME_STEPS, "delay": 0.1, "checkpoint-every": CHECKPOINT_EVERY,
                "global-batch-size": GLOBAL_BATCH, "seq-len": SEQ_LEN},
               inputs={"train": str(CORPUS)})
    try:
        wait_for("a checkpoint and 15 committed steps", lambda: _marker(
            job, CHECKPOINT_EVERY) is not None and sum(
            r["committed"] for r in _records(job, 0)) >= LOSE_ALL_AFTER, job)
        for pid in rank_pids_of_job(job.token):  # every rank of every group
            os.kill(pid, signal.SIGKILL)
        job.wait(logs=False)
    finally:
        if job.job_dir.read_status()["TrainingJobStatus"] == "InProgress":
            job.stop()
    return job


@pytest.fixture(scope="module")
def reference():
    """The job's loader read in this process (its global batches by step)."""
    from meshtrain_runtime.data import loader

    return loader(CORPUS, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN, steps=RESUME_STEPS,
                  dp_rank=0, dp_size=1)


def _marker(job: Any, step: int) -> dict[str, Any] | None:
    path = job.job_dir.root / "checkpoints" / f"step_{step:08d}" / "meshtrain-checkpoint.json"
    return json.loads(path.read_text()) if path.exists() else None


def _rows(job: Any, dp_rank: int) -> list[dict[str, Any]]:
    """The batches rank `dp_rank` was handed, in order, with its host's attempt."""
    path = job.job_dir.host_paths(f"algo-{dp_rank // SHARD + 1}").output_data_dir / (
        f"ft-rows-dp{dp_rank}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _slice(reference: Any, step: int, dp_rank: int) -> tuple[list[int], list[list[int]]]:
    """(sample ids, samples) of dp rank `dp_rank` of GROUPS x SHARD in global batch `step`."""
    return loader_slice(reference, step, dp_rank, GROUPS * SHARD)


def test_a_job_that_lost_every_group_completes_from_its_checkpoint(resumed):
    description = resumed.describe()
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    events = description["FaultTolerance"]["Recoveries"]
    assert sorted(e["ReplicaGroup"] for e in events) == [0, 1]
    assert all(e["RestartedAt"] for e in events)  # the default budget restarted both
    assert description["FaultTolerance"]["CommittedSteps"] == RESUME_STEPS


def test_each_checkpoint_was_written_by_one_group_with_the_loader_at_its_step(resumed):
    writes: dict[int, set[int]] = {}
    for host in ("algo-1", "algo-2"):
        folder = resumed.job_dir.host_paths(host).output_data_dir / "fault_tolerance"
        for path in folder.glob("checkpoints-*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record["kind"] == "write":
                    writes.setdefault(record["step"], set()).add(record["replica_group"])
    assert sorted(writes) == list(range(CHECKPOINT_EVERY, RESUME_STEPS + 1, CHECKPOINT_EVERY))
    assert all(len(groups) == 1 for groups in writes.values()), writes
    steps = sorted(p.name for p in (resumed.job_dir.root / "checkpoints").iterdir())
    assert steps == [f"step_{s:08d}" for s in sorted(writes)]
    for step in writes:  # the job's committed steps and the loader's position agree
        marker = _marker(resumed, step)
        assert marker["fault_tolerance"]["step"] == marker["loader"]["batches"] == step


def test_both_groups_began_again_together_at_the_checkpoints_step(resumed):
    restarted = max(e["RestartedAt"] for e in resumed.job_dir.read_status()[
        "FaultToleranceEvents"])
    for group in range(GROUPS):
        after = [r for r in _records(resumed, group) if r["time"] > restarted]
        first = min(after, key=lambda r: r["time"])
        assert first["step"] == CHECKPOINT_EVERY  # the latest checkpoint when every rank died
        assert first["participants"] == [0, 1] and not first["healed"]


def test_the_loader_resumed_at_the_checkpoint_no_sample_twice_none_skipped(resumed, reference):
    """Each rank's first attempt read steps 0.. up to the kill, its second from the
    checkpoint's step to the end, each batch its slice of the job's step. The run as it stands
    (the first attempt's steps before the checkpoint, then the second's) read every sample of
    global batches 0..39 once: none twice, none skipped."""
    read: Counter[int] = Counter()
    for dp_rank in range(GROUPS * SHARD):
        lines = _rows(resumed, dp_rank)
        for line in lines:
            assert line["samples"] == _slice(reference, line["step"], dp_rank)[1], line["step"]
        first = [line["step"] for line in lines if line["attempt"] == "1"]
        second = [line["step"] for line in lines if line["attempt"] == "2"]
        assert first == list(range(len(first))) and len(first) > CHECKPOINT_EVERY, first
        assert second == list(range(CHECKPOINT_EVERY, RESUME_STEPS)), second[:3]
        for step in [s for s in first if s < CHECKPOINT_EVERY] + second:
            read.update(_slice(reference, step, dp_rank)[0])
    every = [int(i) for step in range(RESUME_STEPS) for i in reference.sample_ids(step)]
    assert len(set(every)) == len(every)  # one epoch: distinct samples
    assert read == Counter(every)


def test_every_loss_is_the_uninterrupted_runs(resumed, reference):
    """Every step of every attempt had both groups: one process running the steps in order,
    each on both groups' rows, gives each logged loss within 1e-5 (a redone step again)."""
    script = job_script(SCRIPTS / "ft_loader_train.py")
    logged = [r for g in range(GROUPS) for r in _records(resumed, g) if r["committed"]]
    assert all(r["participants"] == [0, 1] for r in logged)
    model, optimizer = replay_start(script, reference.vocab_size)
    expected: dict[tuple[int, int], float] = {}
    for step in range(RESUME_STEPS):
        losses = []
        for group in range(GROUPS):
            rows = torch.tensor([row for s in range(SHARD)
                                 for row in _slice(reference, step, group * SHARD + s)[1]])
            losses.append(script.loss_fn(model(rows[:, :-1]), rows[:, 1:]))
            expected[(step, group)] = losses[-1].item()
        torch.stack(losses).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    worst = max(abs(r["loss"] - expected[(r["step"], r["replica_group"])]) for r in logged)
    assert worst <= 1e-5, worst
    redone = {r["step"] for r in logged if r["step"] >= CHECKPOINT_EVERY}
    assert len([r for r in logged if r["step"] in redone]) > len(redone) * GROUPS

