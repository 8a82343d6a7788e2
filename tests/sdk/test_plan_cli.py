"""`meshtrain plan`: registered on a parser, run end to end, JSON against its schema."""

from __future__ import annotations

import argparse
import json

import jsonschema
import pytest
from transformers import LlamaConfig

from meshtrain.plan.cli import plan_main, register
from meshtrain.plan.schema import PLAN_JSON_SCHEMA


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="meshtrain")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    code = args.handler(args)
    return code, capsys.readouterr().out


def test_num_params_on_eight_gpus_json(capsys):
    code, out = run(["--num-params", "7e9", "--gpus", "8", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    jsonschema.validate(data, PLAN_JSON_SCHEMA)
    stages = data["model_state_bytes_per_gpu"]
    # 7e9 params, 8 GPUs, 16 B/param: ddp 16N; zero1 4N + 12N/8; zero2 2N + 14N/8; zero3 16N/8
    assert stages == {"data_parallel_degree": 8, "ddp": 112_000_000_000,
                      "zero1": 38_500_000_000, "zero2": 26_250_000_000,
                      "zero3": 14_000_000_000}
    assert data["cluster"]["world_size"] == 8
    assert data["cluster"]["gpu_memory_bytes"] == 80 * 2**30
    best = data["recommendation"]
    assert best["fits"] and best["rank"] == 1
    assert best["memory_bytes"]["peak"] <= best["memory_bytes"]["capacity"]
    assert best["distribution"]["smdistributed"]["modelparallel"]["parameters"] == best["layout"]
    assert len(data["candidates"]) == 10 and data["num_candidates"] > 10


def test_llama2_70b_on_four_p4d_table(capsys):
    code, out = run(["--model", "llama2-70b", "--instance-type", "ml.p4d.24xlarge",
                     "--instance-count", "4"], capsys)
    # 16 B/param over 32 GPUs is 32.1 GiB of 37 GiB usable; foreach Adam's step buffer
    # (4 B/param) tips every layout over, so the planner names a larger cluster.
    assert code == 0  # the plan was printed; it says that nothing fits
    assert "llama2-70b on 4 x ml.p4d.24xlarge" in out
    assert "zero3 32.1 GiB" in out
    assert "No layout fits" in out and "nodes of this kind" in out
    strict, _ = run(["--model", "llama2-70b", "--instance-type", "ml.p4d.24xlarge",
                     "--instance-count", "4", "--strict"], capsys)
    assert strict == 1
    code, out = run(["--model", "llama2-70b", "--instance-type", "ml.p4d.24xlarge",
                     "--instance-count", "4", "--fused-optimizer", "--top", "3"], capsys)
    assert code == 0 and "Recommended:" in out


def test_smp_convention_counts_20_bytes(capsys):
    code, out = run(["--num-params", "1e9", "--gpus", "8", "--convention", "smp", "--json",
                     "--top", "1"], capsys)
    assert code == 0
    assert json.loads(out)["model_state_bytes_per_gpu"]["ddp"] == 20e9


def test_dimensions_and_config_json(capsys, tmp_path):
    code, out = run(["--hidden-size", "4096", "--num-layers", "32", "--num-heads", "32",
                     "--intermediate-size", "11008", "--vocab-size", "32000", "--gpus", "8",
                     "--json", "--top", "1"], capsys)
    assert json.loads(out)["model"]["num_params"] == 6_738_415_616  # Llama 2 7B
    LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                num_attention_heads=8, vocab_size=1000).save_pretrained(tmp_path)
    code, out = run(["--model", str(tmp_path / "config.json"), "--gpus", "2", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["model"]["hidden_size"] == 256 and data["model"]["source"] == "config.json"
    jsonschema.validate(data, PLAN_JSON_SCHEMA)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--gpus", "8"], "Name the model one way"),
    (["--model", "llama9", "--gpus", "8"], "Unknown model"),
    (["--model", "llama2-7b"], "Name a cluster"),
    (["--model", "llama2-7b", "--gpus", "12"], "not a whole number of nodes"),
    (["--model", "llama2-7b", "--instance-type", "ml.p9.huge"], "Unknown instance type"),
    (["--hidden-size", "64", "--gpus", "1"], "need --num-layers"),
])
def test_bad_arguments_exit_2(argv, needle, capsys):
    assert plan_main(argv) == 2
    assert needle in capsys.readouterr().err


def test_json_has_phases_by_schema_version_3(capsys):
    _, out = run(["--model", "llama2-7b", "--gpus", "8", "--json", "--top", "1"], capsys)
    data = json.loads(out)
    jsonschema.validate(data, PLAN_JSON_SCHEMA)
    assert data["schema_version"] == 3
    memory = data["recommendation"]["memory_bytes"]
    phases = memory["phases"]
    assert list(phases) == ["forward", "loss", "backward", "optimizer_step"]
    assert memory["peak"] == max(phase["total"] for phase in phases.values())
    assert memory["peak"] == phases[memory["peak_phase"]]["total"]
    for phase in phases.values():  # a phase's total is its terms' sum (each rounded up)
        assert abs(phase["total"] - sum(phase["terms"].values())) <= len(phase["terms"])


def test_help_says_when_it_exits_non_zero(capsys):
    with pytest.raises(SystemExit):
        plan_main(["--help"])
    text = capsys.readouterr().out
    assert "0 once the plan is printed, whether or not a layout fits" in text
    assert "with --strict, 1 when no layout fits" in text and "2 for a bad argument" in text


def test_table_fits_80_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out = run(["--model", "llama2-13b", "--instance-type", "ml.p4d.24xlarge",
                     "--instance-count", "2", "--top", "5"], capsys)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    header = next(line for line in out.splitlines() if "layout" in line)
    assert "peak GiB" in header and "fits" in header and "phase" in header
    assert "comm GB/step" not in header  # dropped first at 80 columns
    monkeypatch.setenv("COLUMNS", "140")
    _, wide = run(["--model", "llama2-13b", "--instance-type", "ml.p4d.24xlarge",
                   "--instance-count", "2", "--top", "5"], capsys)
    assert "comm GB/step" in wide and "activations" in wide


def test_local_instance_plans_cpu_ranks(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    code, out = run(["--model", "llama2-7b", "--instance-type", "local",
                     "--processes-per-host", "4", "--top", "2"], capsys)
    assert code == 0
    assert "per GPU" not in out and "GPUs" not in out
    assert "CPU ranks" in out and "per CPU rank" in out


def test_plot_writes_a_stacked_bar_chart(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "phases.png"
    code, _ = run(["--model", "llama2-7b", "--gpus", "8", "--top", "1", "--plot",
                   str(target)], capsys)
    assert code == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plan_main(["--model", "llama2-7b", "--gpus", "8", "--plot",
                      str(tmp_path / "x.txt")]) == 2
    assert "use a .png, .svg or .pdf" in capsys.readouterr().err


def test_largest_layer_and_optimizer_offload_flags(capsys):
    base = ["--model", "llama2-7b", "--gpus", "8", "--json", "--top", "1"]
    _, out = run(base, capsys)
    plain = json.loads(out)["recommendation"]["memory_bytes"]["phases"]
    _, out = run([*base, "--largest-layer-params", "4e8", "--optimizer-offload"], capsys)
    data = json.loads(out)
    changed = data["recommendation"]["memory_bytes"]["phases"]
    assert changed["optimizer_step"]["terms"]["optimizer_states"] == 0
    assert changed["forward"]["terms"]["gathered_parameters"] > plain["forward"]["terms"][
        "gathered_parameters"]
