"""meshtrain_runtime.metrics prints lines that the MetricDefinitions meshtrain sends capture."""

from __future__ import annotations

import re

import pytest

from meshtrain import ConfigError
from meshtrain.backends.sagemaker.metrics import metric_definitions, with_standard_definitions
from meshtrain.contract.metrics import STANDARD_METRICS, format_metrics_line
from meshtrain_runtime.metrics import format_metric_line, log_metric, log_metrics


def captured(definition: dict[str, str], log: str) -> list[str]:
    """What SageMaker records: the first group of every match in the log."""
    return re.findall(definition["Regex"], log)


@pytest.mark.parametrize("value", [0.25, 1e-05, -3.5, 1234567.0, 2, 6.02e23])
def test_value_round_trips_through_the_regex(value):
    (definition,) = metric_definitions("train:loss")
    line = format_metric_line("train:loss", value, step=7)
    assert [float(v) for v in captured(definition, line)] == [float(value)]


def test_lines_are_matched_inside_torchrun_prefixed_logs_and_names_do_not_collide(capsys,
                                                                                 monkeypatch):
    monkeypatch.setenv("RANK", "0")
    log_metric("loss", 0.5, step=1)
    log_metric("val_loss", 0.75, step=1)
    log_metrics(step=2, loss=0.25, lr=1e-4)
    out = capsys.readouterr().out
    assert out.splitlines() == ["[meshtrain metric] loss=0.5 step=1",
                                "[meshtrain metric] val_loss=0.75 step=1",
                                "[meshtrain metric] loss=0.25 lr=0.0001 step=2"]
    log = "\n".join(f"[algo-1 rank 0] {line}" for line in out.splitlines())
    loss, val_loss, lr = metric_definitions("loss", "val_loss", "lr")
    assert captured(loss, log) == ["0.5", "0.25"]
    assert captured(val_loss, log) == ["0.75"]
    assert captured(lr, log) == ["0.0001"]


def test_only_rank_zero_prints(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    log_metric("loss", 0.5)
    log_metrics(loss=0.5)
    assert capsys.readouterr().out == ""


def test_bad_names_are_rejected_on_both_sides():
    with pytest.raises(ConfigError, match="metric name 'train loss' is invalid"):
        metric_definitions("train loss")
    with pytest.raises(ConfigError, match="unique"):
        metric_definitions("loss", "loss")
    with pytest.raises(ValueError, match="invalid"):
        format_metric_line("train loss", 1.0)


def test_non_finite_values_print_but_are_not_captured():
    (definition,) = metric_definitions("loss")
    assert captured(definition, format_metric_line("loss", float("nan"))) == []
    assert format_metric_line("loss", float("inf")) == "[meshtrain metric] loss=inf"


# Names that contain a standard metric's name but are other metrics: never captured as it.
NEAR_MISSES = ("eval/{}", "val:{}", "x{}", "{}_scale", "{}.ema", "{}-2", "{}:max")


@pytest.mark.parametrize("name", STANDARD_METRICS)
def test_each_standard_metric_is_captured_from_a_multi_value_line_and_never_a_near_miss(name):
    (definition,) = [d for d in with_standard_definitions([]) if d["Name"] == name]
    assert definition == metric_definitions(name)[0]
    misses = {miss.format(name): -(i + 1.5) for i, miss in enumerate(NEAR_MISSES)}
    others = {n: 100.0 + i for i, n in enumerate(STANDARD_METRICS) if n != name}
    first_half = dict(list(misses.items())[:3])
    values = {**first_half, **dict(list(others.items())[:3]), name: 0.125,
              **{k: v for k, v in misses.items() if k not in first_half},
              **dict(list(others.items())[3:])}
    line = "[algo-1 rank 0] " + format_metrics_line(values, step=9)
    assert captured(definition, line) == ["0.125"]
    alone = "[algo-1 rank 0] " + format_metric_line(name, 6.02e23, step=9)  # one-value line
    assert captured(definition, alone) == ["6.02e+23"]
    assert captured(definition, "[algo-1 rank 0] " + format_metrics_line(misses, step=9)) == []
    log = "\n".join([line, "[algo-2 rank 0] plain output " + name + "=5.0", alone])
    assert captured(definition, log) == ["0.125", "6.02e+23"]  # per line, not across lines


def test_regexes_use_plain_constructs_only():
    """SageMaker does not run Python's re: no lookaround, no \\b, no named or lazy groups."""
    for definition in with_standard_definitions([]):
        regex = definition["Regex"]
        assert not re.search(r"\(\?[=!<P]|\\b|\*\?|\+\?", regex), regex
        assert regex.startswith(r"\[meshtrain metric\].* ") and regex.count("(") - regex.count(
            "(?:") == 1, regex  # one capturing group: the value
