"""A node dies mid-job (its slurmd and processes SIGKILLed, slurmd back a few seconds later):
Slurm requeues the job, which resumes from latest_checkpoint() in the same checkpoint folder and
completes with the losses of an uninterrupted run; its status never leaves InProgress meanwhile.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from meshtrain import Estimator

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess, pytest.mark.e2e]

SCRIPTS = Path(__file__).resolve().parents[1] / "e2e" / "scripts"  # resilient_train.py
STEPS = 8
LOSS = re.compile(r"\] step (\d+) loss (\S+)$", re.MULTILINE)


def job(instance_type: str, jobs_dir: Path) -> Estimator:
    return Estimator(entry_point="resilient_train.py", source_dir=str(SCRIPTS),
                     instance_type=instance_type, instance_count=2, jobs_dir=str(jobs_dir),
                     hyperparameters={"steps": STEPS, "step-seconds": 1.5},
                     environment={"OMP_NUM_THREADS": "1"},
                     distribution={"torch_distributed": {"enabled": True,
                                                         "processes_per_host": 1}})


def losses_by_step(log: Path) -> dict[int, list[float]]:
    found: dict[int, list[float]] = {}
    for step, loss in LOSS.findall(log.read_text()):
        found.setdefault(int(step), []).append(float(loss))
    return found


def _watch(running, statuses: list[str]) -> None:
    """Every status the job shows from the node's death until it ends."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        statuses.append(running.describe()["TrainingJobStatus"])
        if statuses[-1] != "InProgress":
            return
        time.sleep(1)


def test_a_dead_node_requeues_the_job_which_resumes_from_its_checkpoint(slurm_cluster, tmp_path):
    on_slurm = job("slurm", tmp_path).fit(wait=False, job_name="survives")
    log = tmp_path / "survives" / "job.log"
    deadline = time.monotonic() + 180
    while "step 2 loss" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "step 2 loss" in log.read_text(), log.read_text()
    statuses: list[str] = []
    watcher = threading.Thread(target=_watch, args=(on_slurm, statuses), daemon=True)
    watcher.start()
    slurm_cluster.kill_node("n2")
    time.sleep(3)
    slurm_cluster.start_node("n2")
    job("local", tmp_path).fit(wait=True, job_name="uninterrupted", logs=False)  # meanwhile
    watcher.join(timeout=300)
    assert set(statuses) == {"InProgress", "Completed"}, (statuses, on_slurm.describe())
    assert statuses[-1] == "Completed"
    text = log.read_text()
    assert re.search(r"resumed from step \d+", text), text
    transitions = [t["StatusMessage"] for t in on_slurm.describe()["SecondaryStatusTransitions"]]
    assert any("Requeued by Slurm" in message for message in transitions), transitions
    expected = losses_by_step(tmp_path / "uninterrupted" / "job.log")
    got = losses_by_step(log)
    assert sorted(expected) == sorted(got) == list(range(STEPS))
    for step, runs in got.items():
        for loss in runs:  # a step run before the failure and again after it: the same loss
            assert abs(loss - expected[step][0]) <= 1e-6, (step, runs, expected[step])
