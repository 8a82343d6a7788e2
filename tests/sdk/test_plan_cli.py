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
    (["--num-params", "nan"], "--num-params nan is not a finite number: give a value such as 7e9"),
    (["--num-params", "inf", "--gpus", "8"], "--num-params inf is not a finite number"),
    (["--num-params", "7e9", "--gpus", "8", "--reserve-gib", "nan"], "--reserve-gib nan is not"),
])
def test_bad_arguments_exit_2(argv, needle, capsys):
    assert plan_main(argv) == 2
    assert needle in capsys.readouterr().err


def test_json_has_phases_by_schema_version_4(capsys):
    _, out = run(["--model", "llama2-7b", "--gpus", "8", "--json", "--top", "1"], capsys)
    data = json.loads(out)
    jsonschema.validate(data, PLAN_JSON_SCHEMA)
    assert data["schema_version"] == 4
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


def _header(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if "layout" in line and "┃" in line)
    return [cell.strip() for cell in line.strip("┃ ").split("┃")]


@pytest.mark.parametrize(("argv", "title"), [
    (["--gpus", "8"], "on 8 x 80 GiB GPUs (1 host of 8, world size 8)"),
    (["--gpus", "16", "--gpu-memory", "40"], "on 16 x 40 GiB GPUs (2 hosts of 8, world size 16)"),
    (["--instance-type", "ml.p4d.24xlarge", "--instance-count", "2"],
     "on 2 x ml.p4d.24xlarge (8 ranks per host, world size 16)"),
])
def test_the_title_counts_what_it_names(argv, title, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "140")
    _, out = run(["--model", "llama3-8b", "--top", "1", *argv], capsys)
    assert title in out.splitlines()[0]


@pytest.mark.parametrize(("argv", "gpu"), [
    (["--gpus", "8"], "A100-SXM4-80GB speeds: 312 TFLOP/s"),
    (["--instance-type", "ml.p5.48xlarge"], "H100-SXM5-80GB speeds: 989 TFLOP/s"),
    (["--instance-type", "ml.p4d.24xlarge"], "A100-SXM4-40GB speeds: 312 TFLOP/s"),
    (["--instance-type", "ml.g5.48xlarge"], "A10G speeds: 70 TFLOP/s"),
])
def test_tokens_per_s_names_the_gpu_it_assumes(argv, gpu, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per printed paragraph
    _, out = run(["--model", "llama3-8b", "--top", "1", *argv], capsys)
    assert f"tokens/s assumes {gpu} dense half-precision peak at 40% of it" in out
    assert ("--gpus names no GPU model: it plans with A100-SXM4-80GB speeds" in out) == (
        argv[0] == "--gpus")


@pytest.mark.parametrize("width", ["80", "100", "140"])
def test_every_column_shown_is_explained_and_every_one_left_out_is_named(width, capsys,
                                                                           monkeypatch):
    monkeypatch.setenv("COLUMNS", width)
    _, out = run(["--model", "llama3-8b", "--gpus", "8", "--top", "3"], capsys)
    shown = _header(out)
    every = ["#", "pp", "layout", "peak GiB", "fits", "phase", "tokens/s", "states",
             "activations", "temp", "comm GB/step"]
    assert shown == every[:len(shown)] and len(shown) >= 6
    lines = out.splitlines()
    for name in shown:
        assert any(line.startswith(f"  {name}: ") for line in lines), name  # its legend row
    left_out = every[len(shown):]
    flat = " ".join(out.split())
    if left_out:
        assert f"left out: {', '.join(left_out)}, for width" in flat
    else:
        assert "left out" not in flat
    # the phase table's columns: the starred one is the peak, and the legend says so
    assert "loss*" in out and "* marks the peak phase, whose total is the table's peak" in flat
    assert "Phases: forward; loss (the logits and the loss" in flat


def test_piped_output_keeps_every_column(capsys, monkeypatch):
    """Not a terminal and no COLUMNS (`meshtrain plan ... | less`): nothing is cut to 80."""
    monkeypatch.delenv("COLUMNS", raising=False)
    _, out = run(["--model", "llama3-8b", "--gpus", "8", "--top", "3"], capsys)
    assert _header(out)[-1] == "comm GB/step"
    assert "left out" not in out
