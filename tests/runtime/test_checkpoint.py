"""Checkpoint files, resume discovery and errors, in one process (no torchrun).

Layout changes across ranks are in test_checkpoint_multiprocess.py; here: the completion
marker (an interrupted save is never resumed from), step directories, SM_CHECKPOINT_DIR, the
ConfigErrors for bad paths and values, the export without safetensors, and the package's
lazy exports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime import checkpoint
from meshtrain_runtime.checkpoint import (
    MARKER_NAME,
    export_full_state_dict,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    step_dir,
)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                   b.state_dict().values(), strict=True))


class _Crash(RuntimeError):
    pass


def _crash_after_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP writes every file, then the job dies before the marker (e.g. the host is lost)."""
    real_save = checkpoint.sharded.dcp.save

    def save_then_crash(*args, **kwargs):
        real_save(*args, **kwargs)
        raise _Crash("killed after the DCP files, before the marker")

    monkeypatch.setattr(checkpoint.sharded.dcp, "save", save_then_crash)


def test_interrupted_save_is_ignored_by_latest_and_load(tmp_path, monkeypatch):
    model, optimizer = _trained(0)
    first = save_checkpoint(tmp_path, model, optimizer, step=1, extra={"epoch": 0})
    _crash_after_files(monkeypatch)
    with pytest.raises(_Crash):
        save_checkpoint(tmp_path, *_trained(1), step=2)
    interrupted = step_dir(tmp_path, 2)
    assert (interrupted / ".metadata").is_file() and not (interrupted / MARKER_NAME).exists()
    assert latest_checkpoint(tmp_path) == first
    restored = _model(5)
    info = load_checkpoint(tmp_path, restored)  # the root: its latest completed step
    assert info == {"step": 1, "extra": {"epoch": 0}, "path": str(first), "rng_restored": True}
    assert _same_weights(restored, model)
    with pytest.raises(ConfigError, match="no completed checkpoint"):
        load_checkpoint(interrupted, _model(5))


def test_overwriting_a_completed_step_drops_its_marker_first(tmp_path, monkeypatch):
    model, optimizer = _trained(0)
    target = save_checkpoint(tmp_path, model, optimizer, step=3)
    assert latest_checkpoint(tmp_path) == target
    _crash_after_files(monkeypatch)
    with pytest.raises(_Crash):
        save_checkpoint(tmp_path, *_trained(1), step=3)
    assert latest_checkpoint(tmp_path) is None  # half-new files never pass as the old save


def test_latest_checkpoint_picks_the_highest_completed_step(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None  # a fresh start
    model = _model(0)
    for step in (9, 10, 2):
        save_checkpoint(tmp_path, model, step=step)
    (tmp_path / "step_00000099").mkdir()  # no marker
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000010"
    record = json.loads((tmp_path / "step_00000010" / MARKER_NAME).read_text())
    assert record["step"] == 10 and record["has_optimizer"] is False


def test_default_directory_is_sm_checkpoint_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    model, optimizer = _trained(0)
    written = save_checkpoint(None, model, optimizer, step=4)
    assert written == tmp_path / "ckpt" / "step_00000004"
    assert latest_checkpoint() == written
    restored = _model(7)
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=1e-2)
    assert load_checkpoint(None, restored, restored_optimizer)["step"] == 4
    assert _same_weights(restored, model)
    state, loaded = optimizer.state_dict()["state"], restored_optimizer.state_dict()["state"]
    assert all(torch.equal(state[i]["exp_avg_sq"], loaded[i]["exp_avg_sq"]) for i in state)


def test_bad_paths_and_values_raise_config_error(tmp_path):
    model, optimizer = _trained(0)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="no such directory"):
        load_checkpoint(tmp_path / "nowhere", model)
    with pytest.raises(ConfigError, match="no completed checkpoint"):
        load_checkpoint(tmp_path, model)
    with pytest.raises(ConfigError, match="is a file"):
        save_checkpoint(a_file, model)
    with pytest.raises(ConfigError, match="is a file"):
        latest_checkpoint(a_file)
    for call in (save_checkpoint, load_checkpoint):
        with pytest.raises(ConfigError, match="SM_CHECKPOINT_DIR"):
            call("s3://bucket/ckpt", model)
    with pytest.raises(ConfigError, match="step must be an int >= 0"):
        save_checkpoint(tmp_path, model, step=-1)
    with pytest.raises(ConfigError, match="JSON-serialisable"):
        save_checkpoint(tmp_path / "x", model, step=1, extra={"rng": torch.zeros(2)})
    assert not (tmp_path / "x").exists()  # refused before anything was written
    save_checkpoint(tmp_path / "model_only", model, step=1)
    with pytest.raises(ConfigError, match="saved without an optimizer"):
        load_checkpoint(tmp_path / "model_only", model, optimizer)


def test_resume_after_init_and_transform_in_one_process(tmp_path, single_process_runtime):
    mr.init({})
    model = mr.transform(_model(0))  # FSDP2 over a world of one: DTensor parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path, model, optimizer, step=1)
    plain = _model(3)
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    load_checkpoint(tmp_path, plain, plain_optimizer)
    for name, value in plain.state_dict().items():
        assert torch.equal(value, model.state_dict()[name].full_tensor()), name
    assert plain_optimizer.state_dict()["state"][0]["step"].item() == 1


def test_export_without_a_safetensors_suffix_uses_torch_save(tmp_path):
    model = _model(0)
    written = export_full_state_dict(model, tmp_path / "weights.bin")
    assert written == tmp_path / "weights.bin"
    exported = torch.load(written)
    assert exported.keys() == model.state_dict().keys()
    assert all(torch.equal(exported[k], v) for k, v in model.state_dict().items())


def test_export_copies_tied_weights_apart_for_safetensors(tmp_path):
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Embedding(6, 4), nn.Linear(4, 6, bias=False))
    model[1].weight = model[0].weight  # tied, as HF ties embeddings and the LM head
    written = export_full_state_dict(model, tmp_path / "served")
    assert written == tmp_path / "served" / "model.safetensors"
    loaded = load_file(str(written))
    assert set(loaded) == {"0.weight", "1.weight"}
    assert torch.equal(loaded["0.weight"], loaded["1.weight"])


def test_package_exports_are_lazy():
    code = ("import sys, meshtrain_runtime as m; assert 'torch' not in sys.modules; "
            "assert {'save_checkpoint', 'load_checkpoint', 'latest_checkpoint'} <= set(m.__all__);"
            " from meshtrain_runtime.checkpoint import save_checkpoint; "
            "assert m.save_checkpoint is save_checkpoint")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert mr.latest_checkpoint is latest_checkpoint
    assert Path(checkpoint.default_checkpoint_dir()).is_absolute()


def test_the_earlier_export_module_path_still_works(tmp_path):
    """`meshtrain_runtime.export` (the exporter's home before checkpoint/ became a package) is
    the same function, and still runs as a command."""
    from meshtrain_runtime import export as earlier
    from meshtrain_runtime.checkpoint.export import export_to_hf

    assert earlier.export_to_hf is export_to_hf
    done = subprocess.run([sys.executable, "-m", "meshtrain_runtime.export", str(tmp_path),
                           "--hf", str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "holds no completed meshtrain checkpoint" in done.stderr
