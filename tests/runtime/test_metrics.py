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
    metric_definitions,
    parse_metric_line,
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


def test_log_prints_standard_lines_on_rank_zero_that_definitions_capture(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    metrics.configure(num_params=1000, num_layers=1, hidden_size=8, seq_len=4, world_size=2,
                      peak_tflops=1.0)
    first = metrics.log(step=0, loss=2.5)  # starts the clock: no throughput yet
    assert "train:tokens_per_sec" not in first
    second = metrics.log(step=1, loss=2.0, tokens=800, seconds=0.5, lr=1e-3)
    assert second["train:tokens_per_sec"] == 1600.0
    assert second["train:tflops"] == (6 * 1000 + 12 * 1 * 8 * 4) * 1600.0 / 2 / 1e12
    assert second["train:lr"] == 1e-3 and second["train:cpu_rss_gib"] > 0
    lines = capsys.readouterr().out.splitlines()
    parsed = [parse_metric_line(f"[algo-1 rank 0] {line}") for line in lines]
    assert MetricRecord("train:loss", 2.0, 1) in parsed
    assert all(record is not None for record in parsed)
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
