"""Issue 42's acceptance with [data]'s loader, and issue 40's fault-tolerance point, through the
Estimator, in one job: a ``for inputs, targets in loader`` script with no fault-tolerance code.

The docs' lead example (``fault_tolerance: {"replica_groups": 2}`` and nothing else: no
max_restarts, no min_replica_groups), 2 hosts x 2 processes, hybrid_shard_degree 2, running
scripts/ft_loader_train.py on the repository's corpus as its `train` channel: 240 steps of about
0.25 s, 2 DataLoader workers per rank (they prepare the next batches ahead and start over at the
step the job asks for: a step run again, a healed group). Once group 1 has committed 10 steps
the test SIGKILLs one of its ranks and then only watches: nothing holds, delays or orders the
restart, and group 0 steps alone while group 1 is down. Every check reads the job's own records
(the groups' step lines, markers, each rank's row file and end file, status.json, describe())
and compares the rows with the same loader read in this process.

Issue 42 ("the same with [data]'s loader"): the job Completes with 240 committed steps
(describe()); all four ranks end their loops at step 240 and the groups' shards are bitwise
equal; group 1 is back and stepping within 30 s of the kill; group 0 never goes more than 5 s
without a committed step until then; no group steps after another finished.

Issue 40: every batch a rank was handed is its dp rank's slice of the job's step (a step that
did not commit is read again); the healed group reads the job's current rows; over the
committed steps no sample is consumed twice, and the only rows not trained on are the killed
group's shares of the steps committed without it (docs/data.md, "Fault tolerance"); a
one-process replay of the committed steps gives every loss within 1e-5; every group's loop ends
at the same job step.

On a quiet 2-core box (load <= 4) the time bounds hold by design (docs/fault-tolerance.md,
"Tests and measured figures"); on a loaded one the restart may come too late: then group 0
finishes the run alone and the group-1 checks fail, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
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
    job_script,
    lead_example_distribution,
    loader_slice,
    rank_of_group,
    replay_start,
    steps_after_finish,
    survivor_gaps,
    wait_for,
)

from meshtrain import Estimator
from meshtrain.backends.hosts.processes import pids_of_job
from meshtrain.contract.fault_tolerance import FINISHED, SUPERSEDED, read_markers

torch = import_or_skip("torch")
import_or_skip("torchft")  # meshtrain[ft]: missing, a skip here and a failure under CI

SCRIPTS = Path(__file__).parent / "scripts"
CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus"
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]
GLOBAL_BATCH, SEQ_LEN, NUM_WORKERS = 8, 16, 2
DISTRIBUTION = lead_example_distribution()


@dataclass
class Run:
    job: Any
    killed_at: float

    def data_dir(self, group: int) -> Path:
        return self.job.job_dir.host_paths(f"algo-{group + 1}").output_data_dir

    def records(self, group: int) -> list[dict[str, Any]]:
        path = self.data_dir(group) / "fault_tolerance" / f"replica-{group}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def rows(self, dp_rank: int) -> list[dict[str, Any]]:
        path = self.data_dir(dp_rank // SHARD) / f"ft-rows-dp{dp_rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def end(self, dp_rank: int) -> dict[str, Any]:
        path = self.data_dir(dp_rank // SHARD) / f"ft-end-dp{dp_rank}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def markers(self, kind: str) -> dict[int, dict[str, Any]]:
        return read_markers(self.job.job_dir.root / "fault_tolerance", kind)

    def back(self) -> dict[str, Any]:
        """Group 1's first committed step after the kill, with itself in the quorum."""
        back = back_after(self.records(1), 1, self.killed_at)
        assert back, ("group 1 never stepped again before the job ended\n"
                      f"{self.job.job_dir.log_file.read_text()[-4000:]}")
        return back


def _in_progress(job: Any) -> bool:
    return job.job_dir.read_status()["TrainingJobStatus"] == "InProgress"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    patch = pytest.MonkeyPatch()
    patch.setenv("OMP_NUM_THREADS", "1")
    home = tmp_path_factory.mktemp("data_fault_tolerance")
    job = Estimator("ft_loader_train.py", source_dir=str(SCRIPTS), instance_count=2,
                    jobs_dir=str(home / "jobs"), distribution=DISTRIBUTION, max_run=900,
                    hyperparameters={"steps": STEPS, "delay": DELAY, "num-workers": NUM_WORKERS,
                                     "global-batch-size": GLOBAL_BATCH, "seq-len": SEQ_LEN}).fit(
        inputs={"train": str(CORPUS)}, wait=False, job_name="ft-loader")
    try:
        probe = Run(job, 0.0)
        wait_for(f"group 1 to commit {KILL_AT_STEP} steps", lambda: sum(
            r["committed"] for r in probe.records(1)) >= KILL_AT_STEP, job)
        pid = rank_of_group(job.token, 1, 1)
        assert pid is not None, "no rank 1 of replica group 1 among the job's processes"
        killed = Run(job, time.time())
        os.kill(pid, signal.SIGKILL)
        job.wait(logs=False)  # watching, not holding
    finally:
        if _in_progress(job):
            job.stop()
        patch.undo()
    return killed


@pytest.fixture(scope="module")
def reference():
    """The same loader read in this process: the job's rows by (step, dp rank)."""
    from meshtrain_runtime.data import loader

    return loader(CORPUS, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN, steps=STEPS,
                  dp_rank=0, dp_size=1)


def _slice(reference: Any, step: int, dp_rank: int) -> tuple[list[int], list[list[int]]]:
    """(sample ids, samples) of dp rank `dp_rank` of GROUPS x SHARD in global batch `step`."""
    return loader_slice(reference, step, dp_rank, GROUPS * SHARD)


def _committed(run: Run) -> dict[int, list[int]]:
    """step -> the groups that took part, over the committed steps of both groups' records."""
    steps: dict[int, list[int]] = {}
    for group in range(GROUPS):
        for record in run.records(group):
            if record["committed"]:
                assert steps.setdefault(record["step"], record["participants"]) == (
                    record["participants"])
    return steps


def _restarted_rows(run: Run, dp_rank: int) -> list[dict[str, Any]]:
    """The batches a rank of group 1 was handed after its restart (its host's attempt 2)."""
    return [line for line in run.rows(dp_rank) if line["attempt"] == "2"]


# --- issue 42: the lead example with the loader ----------------------------------------------

def test_the_job_completes_with_240_committed_steps_and_no_process_outlives_it(run):
    description = run.job.describe()
    assert description["TrainingJobStatus"] == "Completed", description.get("FailureReason")
    assert description["FaultTolerance"]["CommittedSteps"] == STEPS
    (event,) = run.job.job_dir.read_status()["FaultToleranceEvents"]
    assert event["ReplicaGroup"] == 1 and "RestartedAt" in event  # the default budget
    assert pids_of_job(run.job.token) == []


def test_all_four_ranks_end_their_loops_at_step_240(run):
    ends = [run.end(r).get("end") for r in range(GROUPS * SHARD)]
    assert ends == [STEPS] * (GROUPS * SHARD), ends
    assert sorted(_committed(run)) == list(range(STEPS))  # each step committed once, none past
    for group in range(GROUPS):
        assert max(r["step"] for r in run.records(group) if r["committed"]) == STEPS - 1


def test_the_groups_shards_are_bitwise_equal_at_the_end(run):
    for shard in range(SHARD):
        ours, theirs = run.end(shard), run.end(SHARD + shard)
        assert ours.get("digest") and ours.get("digest") == theirs.get("digest"), shard


def test_group_1_steps_again_within_30_s_of_the_kill(run):
    back = run.back()
    assert back["time"] - run.killed_at <= REJOIN_BOUND, back["time"] - run.killed_at
    assert back["healed"] and back["step"] > KILL_AT_STEP  # from its live peer


def test_group_0_never_goes_5_s_without_a_committed_step_until_group_1_is_back(run):
    gaps = survivor_gaps(run.records(0), run.killed_at, run.back()["time"])
    assert gaps and max(gaps) <= SURVIVOR_GAP_BOUND, max(gaps, default=None)


def test_no_group_steps_after_another_finished_and_each_finished_by_itself(run):
    finished = run.markers(FINISHED)
    _, late = steps_after_finish({g: run.records(g) for g in range(GROUPS)}, finished)
    assert late == []
    assert sorted(finished) == list(range(GROUPS)) and run.markers(SUPERSEDED) == {}
    assert all(m["committed_steps"] == STEPS for m in finished.values())
    log = run.job.job_dir.log_file.read_text()
    assert all(f"replica group {g} finished" in log for g in range(GROUPS)), log[-3000:]
    figures = run.job.describe()["FaultTolerance"]  # the group whose hosts exited first
    assert figures["ModelArtifactsFrom"] == [f"algo-{figures['FinishedReplicaGroup'] + 1}"]


# --- issue 40: the rows of the job's step ----------------------------------------------------

def test_every_rank_was_handed_the_rows_of_the_job_step(run, reference):
    for dp_rank in range(GROUPS * SHARD):
        lines = run.rows(dp_rank)
        assert lines, dp_rank
        for line in lines:
            assert line["samples"] == _slice(reference, line["step"], dp_rank)[1], (
                dp_rank, line["step"])


def test_the_survivors_read_each_step_as_often_as_it_ran(run):
    """A step that did not commit keeps its number and runs again: group 0 read its rows once
    per time the step ran, every step of the run."""
    ran = Counter(r["step"] for r in run.records(0))
    for shard in range(SHARD):
        assert Counter(line["step"] for line in run.rows(shard)) == ran
    assert sorted(ran) == list(range(STEPS))


def test_the_healed_group_reads_the_jobs_current_rows(run):
    """Group 1 comes back at the step the job is at (group 0 stepped on alone meanwhile), and
    its loop reads from there to the end: not its loop's first batch, not the step it died in."""
    back, survivor = run.back(), {r["step"]: r for r in run.records(0) if r["committed"]}
    assert back["healed"] and back["participants"] == [0, 1]
    assert survivor[back["step"]]["participants"] == [0, 1]
    assert survivor[back["step"] - 1]["participants"] == [0]  # the job had moved on without it
    for shard in range(SHARD):
        resumed = [line["step"] for line in _restarted_rows(run, SHARD + shard)]
        assert resumed == list(range(back["step"], STEPS)), (shard, resumed[:3])


def test_the_dead_groups_share_of_the_steps_it_missed_is_skipped_and_nothing_twice(run,
                                                                                  reference):
    """docs/data.md's definition: committed step k trained on the slices of the groups in its
    quorum; a group missing from it has its share of global batch k skipped, read by no group
    then or later. So over the committed steps every sample of global batches 0..239 was trained
    on once, except group 1's shares of the steps committed without it, which none was. The
    samples trained on are those the ranks say they were handed for each step they committed."""
    committed = _committed(run)
    alone = sorted(s for s, groups in committed.items() if groups == [0])
    assert alone == list(range(alone[0], run.back()["step"])) and alone[0] >= KILL_AT_STEP
    handed = {(dp_rank, line["step"]): line["samples"] for dp_rank in range(GROUPS * SHARD)
              for line in run.rows(dp_rank)}
    trained: Counter[int] = Counter()
    skipped: set[int] = set()
    unsaid = []  # a killed rank may die between its step's commit and its line
    for step, groups in committed.items():
        for group in range(GROUPS):
            for shard in range(SHARD):
                ids, samples = _slice(reference, step, group * SHARD + shard)
                if group in groups:  # the rank read this step's rows, and they were these
                    said = handed.get((group * SHARD + shard, step))
                    assert said in (samples, None), (group, step)
                    unsaid += [(group, step)] if said is None else []
                    trained.update(ids)
                else:
                    skipped.update(ids)
    assert all(group == 1 and step < alone[0] for group, step in unsaid) and len(unsaid) <= 1
    every = {int(i) for step in range(STEPS) for i in reference.sample_ids(step)}
    assert len(every) == STEPS * GLOBAL_BATCH  # one epoch: distinct samples
    assert max(trained.values()) == 1 and set(trained) | skipped == every
    assert not set(trained) & skipped and len(skipped) == len(alone) * GLOBAL_BATCH // GROUPS
    for shard in range(SHARD):  # group 1 read no skipped share later (at most the step it died in)
        late = [line for line in run.rows(SHARD + shard) if line["step"] in alone]
        assert all(line["attempt"] == "1" and line["step"] == alone[0] for line in late)


def test_a_one_process_replay_of_the_committed_steps_gives_every_loss(run, reference):
    """One process steps the model on the rows of each committed step's groups (their mean
    loss, as the groups' gradient average is): every loss a group logged, within 1e-5."""
    script = job_script(SCRIPTS / "ft_loader_train.py")
    model, optimizer = replay_start(script, reference.vocab_size)
    logged = {(r["step"], g): r["loss"] for g in range(GROUPS) for r in run.records(g)
              if r["committed"]}
    worst, compared = 0.0, 0
    committed = _committed(run)
    for step, groups in sorted(committed.items()):
        losses = []
        for group in groups:
            rows = torch.tensor([row for s in range(SHARD)
                                 for row in _slice(reference, step, group * SHARD + s)[1]])
            losses.append(script.loss_fn(model(rows[:, :-1]), rows[:, 1:]))
            worst = max(worst, abs(logged[(step, group)] - losses[-1].item()))
            compared += 1
        torch.stack(losses).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert any(groups == [0] for groups in committed.values())  # group 0 stepped alone
    assert worst <= 1e-5 and compared == sum(len(g) for g in committed.values()), (worst,
                                                                                   compared)
