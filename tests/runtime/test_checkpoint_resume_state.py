"""Checkpoint extras for resuming: RNG states, keep-last pruning, asynchronous saves."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from meshtrain.errors import ConfigError
from meshtrain_runtime.checkpoint import (
    MARKER_NAME,
    PendingCheckpoint,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_dir,
)
from meshtrain_runtime.checkpoint.rng import rng_file


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _draws() -> tuple[list[float], float]:
    return torch.rand(3).tolist(), random.random()


def test_resume_restores_the_rng_streams_of_the_saving_rank(tmp_path):
    model = _model()
    torch.manual_seed(7)
    random.seed(7)
    save_checkpoint(tmp_path, model, step=1)
    expected = _draws()  # what the uninterrupted run draws next
    assert rng_file(step_dir(tmp_path, 1), 0).is_file()
    torch.manual_seed(999)
    random.seed(999)
    info = load_checkpoint(tmp_path, _model(1))
    assert info["rng_restored"] is True
    assert _draws() == expected


def test_keep_last_keeps_the_newest_completed_steps_and_drops_interrupted_older_ones(tmp_path):
    model = _model()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, model, step=step)
    interrupted = step_dir(tmp_path, 4)
    interrupted.mkdir()  # a save that died before its marker
    save_checkpoint(tmp_path, model, step=5, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000005"]
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 5)
    # a later in-flight step (no marker yet, newer than the newest) is never touched
    step_dir(tmp_path, 9).mkdir()
    assert prune_checkpoints(tmp_path, 1, newest=5) == [step_dir(tmp_path, 3)]
    assert step_dir(tmp_path, 9).is_dir()


@pytest.mark.parametrize("keep_last, step, fragment", [
    (0, 1, "int >= 1"), (True, 1, "int >= 1"), ("2", 1, "int >= 1"), (2, None, "needs step"),
])
def test_bad_keep_last_raises_config_error_before_writing(tmp_path, keep_last, step, fragment):
    with pytest.raises(ConfigError, match=fragment):
        save_checkpoint(tmp_path / "ckpt", _model(), step=step, keep_last=keep_last)
    assert not (tmp_path / "ckpt").exists()


def test_async_save_copies_the_state_before_training_goes_on(tmp_path, single_process_runtime):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    pending = save_checkpoint(tmp_path, model, optimizer, step=1, async_=True, keep_last=1)
    assert isinstance(pending, PendingCheckpoint)
    model(torch.ones(2, 4)).sum().backward()  # training continues while the files are written
    optimizer.step()
    assert pending.wait() == step_dir(tmp_path, 1)
    assert (step_dir(tmp_path, 1) / MARKER_NAME).is_file()
    fresh = _model(3)
    load_checkpoint(tmp_path, fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1))
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
