"""meshtrain_runtime.metrics prints lines that the MetricDefinitions meshtrain sends capture."""

from __future__ import annotations

import re

import pytest

from meshtrain import ConfigError
from meshtrain.backends.sagemaker.metrics import metric_definitions
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
                                "[meshtrain metric] loss=0.25 step=2",
                                "[meshtrain metric] lr=0.0001 step=2"]
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
