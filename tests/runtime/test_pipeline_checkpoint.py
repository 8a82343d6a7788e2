"""A checkpoint saved by pp2 x dp2 (4 gloo ranks) resumes without pipelining on 2 ranks with the
same losses, optimizer state included (the HF Llama, and the GPT-2-style plain module), and at
pp4 on 4 ranks; ones saved without pipelining and
at pp4 (plain tensors: one rank per stage) resume at pp2 x dp2; the pipelined models' full
exports (pp2 x dp2, pp4) equal the unpipelined model's (three launches, 70-120 s together
on the 2-core box at load 12-30)."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.multiprocess

PARITY = 1e-5  # float32 loss, same model, data and optimizer state
WORKER = Path(__file__).parent / "workers" / "pipeline_checkpoint.py"


def test_pp2_dp2_checkpoint_resumes_without_pipelining(torchrun, tmp_path: Path) -> None:
    saved_all = torchrun(WORKER, 4, "save", str(tmp_path), timeout=300)
    loaded_all = torchrun(WORKER, 2, "load", str(tmp_path), timeout=300)
    at_pp4 = torchrun(WORKER, 4, "load_pp4", str(tmp_path), timeout=300)
    _check_plain_model(saved_all, loaded_all, tmp_path / "gpt")
    saved = [r for r in saved_all if r["model"] == "llama"]
    loaded = [r for r in loaded_all if r["model"] == "llama"]
    assert {r["pp_size"] for r in saved} == {2} and {r["pp_size"] for r in loaded} == {1}
    # the pipelined ranks held parts of the model under the unsplit model's names
    assert set.union(*(set(r["names"]) for r in saved)) == set(loaded[0]["names"])
    assert (tmp_path / "step_00000002" / "config.json").is_file()
    expected = saved[0]["losses"]
    assert all(r["losses"] == expected for r in saved)
    assert {r["pp_size"] for r in at_pp4 if r["case"] == "load_pp4"} == {4}
    # the checkpoints saved without pipelining (by "load") and at pp4 load at pp2 x dp2
    for case in ("plain_to_pp2", "pp4_to_pp2"):
        assert [r["pp_size"] for r in at_pp4 if r["case"] == case] == [2] * 4, case
    assert len(at_pp4) == 12
    for row in loaded + at_pp4:
        errors = [abs(a - b) for a, b in zip(row["losses"], expected, strict=True)]
        assert max(errors) <= PARITY, (row["case"], errors)
    # export_full_state_dict of the pipelined model: every stage, equal to the unpipelined
    # model's export of the same weights (both taken at the save)
    plain = load_file(tmp_path / "export_plain" / "model.safetensors")
    assert set(plain) == set(loaded[0]["names"])
    for piped_at in ("export_pp", "export_pp4"):  # FSDP2 per stage; plain tensors at pp4
        piped = load_file(tmp_path / piped_at / "model.safetensors")
        assert set(piped) == set(plain), piped_at
        for name, tensor in plain.items():
            assert piped[name].shape == tensor.shape, (piped_at, name)
            assert bool((piped[name] == tensor).all()), (piped_at, name)
    assert (tmp_path / "export_pp" / "config.json").is_file()


def _check_plain_model(saved_all: list, loaded_all: list, directory: Path) -> None:
    """The GPT-2-style module saved at pp2 x dp2 resumes without pipelining: the same names
    (the attribute-read position table included), losses and full export."""
    saved = [r for r in saved_all if r["model"] == "gpt"]
    loaded = [r for r in loaded_all if r["model"] == "gpt"]
    assert len(saved) == 4 and len(loaded) == 2
    assert set.union(*(set(r["names"]) for r in saved)) == set(loaded[0]["names"])
    assert "wpe.weight" in loaded[0]["names"]
    for row in loaded:
        errors = [abs(a - b) for a, b in zip(row["losses"], saved[0]["losses"], strict=True)]
        assert max(errors) <= PARITY, errors
    plain = load_file(directory / "export_plain" / "model.safetensors")
    piped = load_file(directory / "export_pp" / "model.safetensors")
    assert set(plain) == set(piped) == set(loaded[0]["names"])
    assert all(bool((piped[name] == plain[name]).all()) for name in plain)
