"""meshtrain_runtime.metrics: standard metric lines, throughput, MFU and the shared line format."""

from __future__ import annotations

import re

import pytest
from ci_guards import import_or_skip
from torch import nn

from meshtrain.contract.accelerators import H100, H100_PCIE, gpu_spec_for_device
from meshtrain.contract.metrics import (
    STANDARD_METRICS,
    MetricRecord,
    format_metric_line,
    format_metrics_line,
    metric_definitions,
    parse_metric_line,
    parse_metric_records,
)
from meshtrain_runtime import metrics
from meshtrain_runtime.throughput import FlopCounter, matmul_parameters


@pytest.fixture(autouse=True)
def _fresh_default_logger():
    metrics.reset()
    yield
    metrics.reset()


def test_mfu_of_a_known_flop_count_and_duration_is_exact():
    flops = FlopCounter(num_params=1_000_000, num_layers=2, hidden_size=64, seq_len=128)
    assert flops.per_token == 6 * 1_000_000 + 12 * 2 * 64 * 128 == 6_196_608
    logger = metrics.MetricsLogger(flops, world_size=4, peak_flops=1e12)
    out = logger.throughput(tokens=4096, seconds=2.0)
    per_device = 6_196_608 * 4096 / 2.0 / 4  # 3,172,663,296 FLOP/s, exact in binary
    assert out == {"train:tokens_per_sec": 2048.0, "train:tflops": per_device / 1e12,
                   "train:mfu": per_device / 1e12}


def test_without_a_flop_count_or_a_known_peak_only_tokens_per_second():
    assert metrics.MetricsLogger().throughput(1000, 4.0) == {"train:tokens_per_sec": 250.0}
    flops = FlopCounter(10, 1, 2, 3)
    out = metrics.MetricsLogger(flops, world_size=1).throughput(1000, 4.0)  # CPU: no peak
    assert set(out) == {"train:tokens_per_sec", "train:tflops"}


def _tiny_llama(tied: bool) -> nn.Module:
    transformers = import_or_skip("transformers")  # missing: skip (fail under CI); broken: error
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=100, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("tied", [False, True])
def test_matmul_parameters_leave_out_lookups_but_keep_a_tied_head(tied):
    model = _tiny_llama(tied)
    everything = sum(p.numel() for p in model.parameters())  # unique parameters
    embedding = model.model.embed_tokens.weight.numel()
    expected = everything if tied else everything - embedding
    assert matmul_parameters(model) == expected
    counter = FlopCounter.build(model, seq_len=16)
    assert (counter.num_layers, counter.hidden_size, counter.num_params) == (2, 32, expected)


def test_log_prints_one_line_per_call_that_parses_back_and_definitions_capture(capsys,
                                                                               monkeypatch):
    monkeypatch.setenv("RANK", "0")
    metrics.configure(num_params=1000, num_layers=1, hidden_size=8, seq_len=4, world_size=2,
                      peak_tflops=1.0)
    first = metrics.log(step=0, loss=2.5)  # starts the clock: no throughput yet
    assert "train:tokens_per_sec" not in first
    second = metrics.log(step=1, loss=2.0, tokens=800, seconds=0.5)
    assert second["train:tokens_per_sec"] == 1600.0
    assert second["train:tflops"] == (6 * 1000 + 12 * 1 * 8 * 4) * 1600.0 / 2 / 1e12
    third = metrics.log(step=2, loss=1.5, lr=1e-3)
    assert third["train:lr"] == 1e-3 and third["train:cpu_rss_gib"] > 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # issue 35: one console line per log() call, not one per metric
    parsed = [parse_metric_records(f"[algo-1 rank 0] {line}") for line in lines]
    # loss, tokens/s, TFLOP/s, MFU and memory: five metrics, one line, five records
    assert [r.name for r in parsed[1]] == ["train:loss", "train:tokens_per_sec", "train:tflops",
                                           "train:mfu", "train:cpu_rss_gib"]
    assert {r.name: r.value for r in parsed[1]} == second and {r.step for r in parsed[1]} == {1}
    assert {r.name: r.value for r in parsed[2]} == third
    log = "\n".join(lines)
    for definition in metric_definitions(*STANDARD_METRICS[:4]):
        found = re.findall(definition["Regex"], log)
        assert found, definition["Name"]


def test_other_ranks_print_nothing_but_return_the_values(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert metrics.log(step=5, loss=1.0)["train:loss"] == 1.0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(("line", "record"), [
    ("[meshtrain metric] train:loss=0.25 step=10", MetricRecord("train:loss", 0.25, 10)),
    ("[algo-2 rank 3] [meshtrain metric] lr=1e-05", MetricRecord("lr", 1e-05, None)),
    ("[meshtrain metric] x=nan step=1", None),  # parsed below: nan is not equal to itself
    ("plain log line", None),
    ("[meshtrain metric] bad name=1", None),
    ("[meshtrain metric] a=1.0 b=2.0 step=3", MetricRecord("a", 1.0, 3)),  # the first record
    ("[meshtrain metric] a=1.0  b=2.0", None),  # not the format: nothing, not a part
])
def test_parse_metric_line(line, record):
    parsed = parse_metric_line(line)
    if "nan" in line:
        assert parsed is not None and parsed.value != parsed.value and parsed.step == 1
    else:
        assert parsed == record


def test_format_and_parse_round_trip():
    for value in (0.1, -3.5, 6.02e23, float("inf")):
        assert parse_metric_line(format_metric_line("m", value, 2)) == MetricRecord("m", value, 2)
    values = {"train:loss": 0.25, "eval/x-y.z": -1e-07, "train:mfu": 0.5, "b": float("-inf")}
    line = format_metrics_line(values, step=10)
    assert line == ("[meshtrain metric] train:loss=0.25 eval/x-y.z=-1e-07 train:mfu=0.5 b=-inf "
                    "step=10")
    assert parse_metric_records(line) == [MetricRecord(n, v, 10) for n, v in values.items()]
    assert parse_metric_records(format_metrics_line(values)) == [
        MetricRecord(n, v, None) for n, v in values.items()]


def test_a_metric_named_step_is_a_record_and_only_a_trailing_integer_is_the_step():
    # a value is a float's repr ("5.0"), a step an integer ("5")
    assert parse_metric_records(format_metrics_line({"a": 1.0, "step": 5.0}, step=6)) == [
        MetricRecord("a", 1.0, 6), MetricRecord("step", 5.0, 6)]
    assert parse_metric_records("[meshtrain metric] step=5") == [MetricRecord("step", 5.0, None)]
    assert parse_metric_records("[meshtrain metric] a=1.0 step=5.0") == [
        MetricRecord("a", 1.0, None), MetricRecord("step", 5.0, None)]
    assert parse_metric_records("[meshtrain metric] step=3 a=1.0 step=4") == [
        MetricRecord("step", 3.0, 4), MetricRecord("a", 1.0, 4)]


def test_a_multi_value_line_needs_values_and_good_names():
    with pytest.raises(ValueError, match="at least one value"):
        format_metrics_line({})
    with pytest.raises(ValueError, match="metric name 'bad name' is invalid"):
        format_metrics_line({"ok": 1.0, "bad name": 2.0})


def test_device_names_map_to_the_peak_table():
    assert gpu_spec_for_device("NVIDIA H100 80GB HBM3") is H100
    assert gpu_spec_for_device("NVIDIA H100 PCIe") is H100_PCIE
    assert gpu_spec_for_device("NVIDIA A100-SXM4-40GB").peak_tflops == 312.0
    assert gpu_spec_for_device("NVIDIA L40") is None  # not L4, not L40S
    assert gpu_spec_for_device("NVIDIA GeForce RTX 4090") is None


def test_global_mean_of_one_process_is_the_value_itself():
    """Across ranks it is checked by every parity test of tests/runtime/test_checkpoint_*.py
    (their workers' losses are meshtrain_runtime.global_mean, compared with one process)."""
    import torch

    import meshtrain_runtime
    from meshtrain_runtime.metrics import global_mean

    assert meshtrain_runtime.global_mean is global_mean
    assert global_mean(torch.tensor(2.5, requires_grad=True) * 2) == 5.0
    assert global_mean(0.25) == 0.25
