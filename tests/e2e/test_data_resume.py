"""Issue 40 through the Estimator: a script fed by the loader from a `train` channel of .jsonl
text resumes exactly, after a restart and on another layout, with no data code of its own.

Three local jobs of scripts/loader_train.py on the repository's corpus (examples/data/corpus):

- the reference: 2 hosts x 2 processes, hybrid sharding (dp 4), 8 steps, a checkpoint after
  4 and 8;
- the restarted job: the same with a checkpoint every 3 steps and ``max_restarts: 1``; on the
  first attempt the last rank SIGKILLs itself at step 4, after the checkpoint of step 3; every
  host restarts and the script resumes from that checkpoint;
- the resharded job: 1 host x 2 processes (dp 2) starting from a copy of the reference's
  checkpoint after 4 steps, running steps 4-7.

Both must end with the reference's losses within 1e-5, and every step's global batch (read back
from the ranks' row files) is the one a single process reads from the same loader.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from meshtrain import Estimator

SCRIPTS = Path(__file__).parent / "scripts"
CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus"
STEPS, GLOBAL_BATCH, SEQ_LEN = 8, 8, 32
LOSS = re.compile(r"step (\d+) loss (\S+)")
pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]


def _job(jobs_dir: Path, name: str, hosts: int, *, hyperparameters: dict | None = None,
         **options) -> object:
    distribution = {"torch_distributed": {"enabled": True, "processes_per_host": 2,
                                          **options.pop("torch_distributed", {})},
                    "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                        "hybrid_shard_degree": 2}}}}
    estimator = Estimator("loader_train.py", source_dir=str(SCRIPTS), instance_count=hosts,
                          jobs_dir=str(jobs_dir), distribution=distribution,
                          hyperparameters={"steps": STEPS, **(hyperparameters or {})},
                          environment={"OMP_NUM_THREADS": "1"}, **options)
    estimator.fit(inputs={"train": str(CORPUS)}, job_name=name, logs=False)
    job = estimator.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Completed", job.describe()
    return job


def _losses(job) -> dict[int, float]:
    """step -> loss from the job log (a later attempt's line for a step replaces an earlier)."""
    found = {}
    for line in job.log_lines():
        match = LOSS.search(line)
        if match:
            found[int(match.group(1))] = float(match.group(2))
    return found


def _global_batches(job, hosts: int) -> dict[int, list[list[int]]]:
    """step -> the samples of every dp rank, in dp order, from the ranks' row files."""
    by_rank: dict[int, dict[int, list]] = {}
    for host in range(1, hosts + 1):
        for path in job.job_dir.host_paths(f"algo-{host}").output_data_dir.glob("rows-dp*.jsonl"):
            rank = int(path.stem.removeprefix("rows-dp"))
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                by_rank.setdefault(entry["step"], {})[rank] = entry["samples"]
    return {step: [row for rank in sorted(ranks) for row in ranks[rank]]
            for step, ranks in by_rank.items()}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> dict[str, object]:
    patch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("data_resume")
    patch.setenv("MESHTRAIN_HOME", str(root / "home"))
    try:
        reference = _job(root / "jobs", "reference", 2)
        restarted = _job(root / "jobs", "restarted", 2,
                         hyperparameters={"checkpoint-every": 3, "kill-step": 4},
                         torch_distributed={"max_restarts": 1})
        half = root / "after-4-steps"
        shutil.copytree(reference.job_dir.root / "checkpoints" / "step_00000004",
                        half / "step_00000004")
        resharded = _job(root / "jobs", "resharded", 1, checkpoint_local_path=str(half))
    finally:
        patch.undo()
    return {"reference": reference, "restarted": restarted, "resharded": resharded}


def _one_process_batches() -> list[list[list[int]]]:
    import torch

    from meshtrain_runtime.data import loader

    return [torch.cat([x, y[:, -1:]], dim=1).tolist()
            for x, y in loader(CORPUS, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN,
                               steps=STEPS)]


def test_a_rank_killed_after_a_checkpoint_restarts_and_ends_with_the_same_losses(jobs):
    reference, restarted = _losses(jobs["reference"]), _losses(jobs["restarted"])
    assert sorted(reference) == sorted(restarted) == list(range(STEPS))
    (failed,) = jobs["restarted"].describe()["FailedAttempts"]
    assert "SIGKILL" in failed["FailureReason"]
    assert "resumed at batch 3 (attempt 2)" in "\n".join(jobs["restarted"].log_lines())
    worst = max(abs(reference[s] - restarted[s]) for s in range(STEPS))
    assert worst <= 1e-5, (reference, restarted)


def test_a_resume_on_another_layout_reads_on_exactly_and_matches_the_losses(jobs):
    reference, resharded = _losses(jobs["reference"]), _losses(jobs["resharded"])
    assert "resumed at batch 4 (attempt 1)" in "\n".join(jobs["resharded"].log_lines())
    assert sorted(resharded) == list(range(4, STEPS))
    worst = max(abs(reference[s] - resharded[s]) for s in resharded)
    assert worst <= 1e-5, (reference, resharded)
    expected = _one_process_batches()
    dp4, dp2 = _global_batches(jobs["reference"], 2), _global_batches(jobs["resharded"], 1)
    assert [dp4[s] for s in range(STEPS)] == expected  # 4 dp ranks: one process's batches
    assert sorted(dp2) == list(range(4, STEPS))
    assert [dp2[s] for s in range(4, STEPS)] == expected[4:]  # none read twice, none skipped
    restarted = _global_batches(jobs["restarted"], 2)  # both attempts (steps 3-7: the second)
    assert [restarted[s] for s in range(STEPS)] == expected
