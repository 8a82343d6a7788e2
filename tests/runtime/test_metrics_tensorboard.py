"""With tensorboard installed, rank 0's metrics also land as TensorBoard scalars where SageMaker's
TensorBoardOutputConfig reads them; other ranks and processes outside a job write nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from meshtrain_runtime import metrics


@pytest.fixture
def job_paths(tmp_path, monkeypatch):
    import torch  # noqa: F401  (the writer is only made for scripts that use torch)

    base = tmp_path / "opt" / "ml"
    (base / "output").mkdir(parents=True)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    metrics.reset()
    yield base
    metrics.reset()


def scalars(folder, name: str) -> list[tuple[int, float]]:
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(name)]


def test_rank_zero_writes_scalars_into_the_tensorboard_output(job_paths, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    metrics.log(step=1, loss=2.5, tokens=1000, seconds=0.5)
    metrics.log(step=2, loss=1.25, tokens=1000, seconds=0.25)
    metrics.log_metric("eval:loss", 3.0, step=2)
    metrics.reset()  # closes the writer
    folder = job_paths / "output" / "tensorboard"
    assert scalars(folder, "train:loss") == [(1, 2.5), (2, 1.25)]
    assert scalars(folder, "train:tokens_per_sec") == [(1, 2000.0), (2, 4000.0)]
    assert scalars(folder, "eval:loss") == [(2, 3.0)]


def test_other_ranks_and_non_jobs_write_nothing(job_paths, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "1")
    metrics.log(step=1, loss=2.5)
    assert not (job_paths / "output" / "tensorboard").exists()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "not-a-job"))
    metrics.reset()
    metrics.log(step=1, loss=2.5)
    assert not (tmp_path / "not-a-job").exists()
