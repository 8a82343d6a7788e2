"""Sharded checkpoints resume on another layout: losses match one uninterrupted process.

Two torchrun launches share one checkpoint root: 4 ranks train two AdamW steps and save on
hybrid 2x2 (2 replicas x shard 2; once synchronously, once asynchronously while a third step
trains), tp 2 x shard 2, and a Mixtral on ep 2; 2 ranks load each into full sharding (ep 1) and
train two more steps, save tp=2 (which also exports the full state dict) and a Mixtral on ep 1,
and resume that on ep 2. This process loads checkpoints into a single rank, and `meshtrain export`
turns the tp 2 x hybrid_shard_degree 2 and the ep 2 checkpoints into HF folders that
from_pretrained loads with the trained logits. Every continued run
must match the single-process run of all four steps (same seed, same global batch) within 1e-5
in float32.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

WORKERS = Path(__file__).parent / "workers"
sys.path.insert(0, str(WORKERS))
import ckpt_support as support  # noqa: E402

from meshtrain.contract.errors import ConfigError  # noqa: E402
from meshtrain_runtime.checkpoint import MARKER_NAME  # noqa: E402

TOLERANCE = 1e-5  # float32 loss, as every parity test here
AFTER = slice(support.STEPS_BEFORE, support.STEPS_BEFORE + support.STEPS_AFTER)

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def launches(torchrun, tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("checkpoints")
    saved = torchrun(WORKERS / "ckpt_save.py", 4, str(root), timeout=300)
    loaded = torchrun(WORKERS / "ckpt_load.py", 2, str(root), timeout=300)
    cases = {record["case"]: record for record in saved + loaded}
    return {"root": root, "cases": cases, "reference": support.reference_losses(),
            "reference_mixtral": support.reference_losses("mixtral")}


def _case(launches: dict[str, Any], name: str) -> dict[str, Any]:
    record = launches["cases"][name]
    assert "error" not in record, record["error"]
    return record


def _max_error(losses: list[float], reference: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(losses, reference, strict=True))


def test_layouts_before_the_save_match_one_process(launches):
    reference = launches["reference"][: support.STEPS_BEFORE]
    hybrid = _case(launches, "save_hybrid_2x2")
    assert (hybrid["replicate"], hybrid["shard"], hybrid["dp_size"]) == (2, 2, 4)
    assert _max_error(hybrid["losses"], reference) < TOLERANCE
    tp = _case(launches, "save_tp2")
    assert tp["tp_size"] == 2
    assert _max_error(tp["losses"], reference) < TOLERANCE
    for record in (hybrid, tp):
        assert (Path(record["saved"]) / MARKER_NAME).is_file()
        assert Path(record["saved"]).name == "step_00000002"


@pytest.mark.parametrize("case, layout", [
    ("save_hybrid_2x2_async", (4, 2, 2, 1, 1)),
    ("save_tp2_shard2", (2, 1, 2, 2, 1)),
    ("save_ep2", (4, 1, 4, 1, 2)),
])
def test_other_layouts_before_the_save_match_one_process(launches, case, layout):
    record = _case(launches, case)
    shape = (record["dp_size"], record["replicate"], record["shard"], record["tp_size"],
             record["ep_size"])
    assert shape == layout
    reference = launches["reference_mixtral" if "ep" in case else "reference"]
    assert _max_error(record["losses"], reference[: support.STEPS_BEFORE]) < TOLERANCE
    assert (Path(record["saved"]) / MARKER_NAME).is_file()


@pytest.mark.parametrize("case, source, model, saved_on", [
    ("hybrid_2x2_to_full_shard_2", "hybrid", "llama", 4),
    ("tp2_to_full_shard_2", "tp", "llama", 2),
    ("hybrid_2x2_async_to_full_shard_2", "hybrid_async", "llama", 4),
    ("tp2_shard2_to_full_shard_2", "tp2_shard2", "llama", 4),
    ("ep2_to_ep1", "ep2", "mixtral", 4),
    ("ep1_to_ep2", "ep1", "mixtral", 2),
])
def test_resume_on_another_layout_of_two_ranks(launches, case, source, model, saved_on):
    record = _case(launches, case)
    assert record["step"] == support.STEPS_BEFORE
    assert record["extra"]["next_step"] == support.STEPS_BEFORE
    # each rank's RNG streams come back only on the world size that saved them
    assert record["rng_restored"] is (saved_on == 2)
    assert Path(record["loaded"]) == launches["root"] / source / "step_00000002"
    reference = launches["reference_mixtral" if model == "mixtral" else "reference"]
    assert _max_error(record["losses"], reference[AFTER]) < TOLERANCE


@pytest.mark.parametrize("source, model", [
    ("hybrid", "llama"), ("tp", "llama"), ("tp2_shard2", "llama"), ("ep2", "mixtral"),
])
def test_resume_in_one_process(launches, single_process_runtime, source, model):
    record = support.load_and_continue(support.FULL_SHARD, launches["root"] / source, model)
    assert single_process_runtime.world_size == 1
    assert record["step"] == support.STEPS_BEFORE
    reference = launches["reference_mixtral" if model == "mixtral" else "reference"]
    assert _max_error(record["losses"], reference[AFTER]) < TOLERANCE


def test_export_from_tp2_is_the_hf_state_dict(launches):
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM

    exported = Path(_case(launches, "save_tp2")["exported"])
    assert exported == launches["root"] / "export_tp" / "model.safetensors"
    weights = load_file(str(exported))
    config = AutoConfig.from_pretrained(exported.parent)  # config.json beside the weights
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and not missing
    reference = support.reference_weights(support.STEPS_BEFORE)
    assert set(weights) == set(reference)
    for name, tensor in weights.items():
        assert tensor.shape == reference[name].shape, name
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=TOLERANCE)


# --- meshtrain export: a checkpoint of any layout to a Hugging Face folder (issue 35.9) ------


def meshtrain_export(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (the client starts the runtime's exporter itself)."""
    return subprocess.run([sys.executable, "-m", "meshtrain.cli", "export", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("case, model_class, how", [
    ("save_tp2_hybrid2", "LlamaForCausalLM", "cli"),  # tp 2 x hybrid_shard_degree 2, 4 ranks
    # experts split over 2 ranks -> HF's fused Mixtral layout; the Python function, in this
    # process (one CLI run is enough to test the command: each costs ~30 s on 2 busy cores)
    ("save_ep2", "MixtralForCausalLM", "function"),
])
def test_meshtrain_export_gives_from_pretrained_the_trained_logits(launches, tmp_path, case,
                                                                   model_class, how):
    import transformers

    from meshtrain_runtime.checkpoint.export import export_to_hf

    record = _case(launches, case)
    if case == "save_tp2_hybrid2":
        assert (record["tp_size"], record["shard"], record["dp_size"]) == (2, 2, 2)
    assert (Path(record["saved"]) / "config.json").is_file()  # kept by save_checkpoint
    out = tmp_path / "hf"
    root = str(Path(record["saved"]).parent)  # the newest completed step is found
    if how == "cli":
        done = meshtrain_export(root, "--hf", str(out))
        assert done.returncode == 0, done.stderr
    else:
        export_to_hf(root, out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = getattr(transformers, model_class).from_pretrained(out)
    with torch.no_grad():
        logits = model(input_ids=support.probe_ids(), use_cache=False).logits
    torch.testing.assert_close(logits, torch.load(record["logits"]), rtol=0, atol=TOLERANCE)


def test_an_export_without_a_config_needs_one(launches, tmp_path):
    import shutil

    from meshtrain.cli_export import MARKER_NAME as CLIENT_MARKER
    from meshtrain_runtime.checkpoint.export import export_to_hf

    assert CLIENT_MARKER == MARKER_NAME  # the client checks the folder without the runtime
    saved = Path(_case(launches, "save_tp2_hybrid2")["saved"])
    bare = tmp_path / "bare"
    shutil.copytree(saved, bare)
    (bare / "config.json").unlink()
    out = tmp_path / "hf"
    refused = meshtrain_export(str(bare), "--hf", str(out))
    assert refused.returncode == 2
    assert "has no config.json" in refused.stderr and "Pass --config" in refused.stderr
    assert not out.exists()  # refused before the exporter ran
    with pytest.raises(ConfigError, match=r"Pass --config config\.json"):
        export_to_hf(bare, out)  # the Python function says the same
    with pytest.raises(ConfigError, match="holds no completed meshtrain checkpoint"):
        export_to_hf(tmp_path, out)
    # in this process, without a process group: the config given explicitly
    assert export_to_hf(bare, out, config=saved / "config.json") == out
    assert (out / "config.json").read_text() == (saved / "config.json").read_text()
    assert (out / "model.safetensors").is_file()
