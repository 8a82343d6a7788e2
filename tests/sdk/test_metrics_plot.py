"""Loss/throughput plots read back from a job's metric lines."""

from __future__ import annotations

import pytest

from meshtrain.contract.metrics import format_metric_line, format_metrics_line
from meshtrain.errors import ConfigError
from meshtrain.metrics_plot import plot_metrics, read_metric_series

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")


def _log() -> list[str]:
    lines = ["[algo-1 rank 0] step 0 starting", "[algo-2] unrelated output"]
    lines.append(f"[algo-1 rank 0] {format_metric_line('train:loss', 4.0, 0)}")  # one value
    for step in range(1, 5):  # several values on one line, as metrics.log() prints them
        values = {"train:loss": 4.0 - step, "train:tokens_per_sec": 1000.0 + step}
        lines.append(f"[algo-1 rank 0] {format_metrics_line(values, step)}")
    return lines


def test_series_follow_the_log_and_skip_other_lines():
    series = read_metric_series(_log())
    assert series["train:loss"] == [(0, 4.0), (1, 3.0), (2, 2.0), (3, 1.0), (4, 0.0)]
    assert series["train:tokens_per_sec"][0] == (1, 1001.0)
    assert set(series) == {"train:loss", "train:tokens_per_sec"}


def test_the_png_has_labelled_axes_and_says_so(tmp_path):
    output = tmp_path / "loss.png"
    figure = plot_metrics(read_metric_series(_log()), output, title="job-1")
    loss_ax, throughput_ax = figure.axes
    assert (loss_ax.get_ylabel(), throughput_ax.get_ylabel()) == ("loss", "tokens/s")
    assert throughput_ax.get_xlabel() == "step"
    assert list(loss_ax.lines[0].get_ydata()) == [4.0, 3.0, 2.0, 1.0, 0.0]
    with Image.open(output) as image:  # read back from disk
        assert image.format == "PNG" and image.size == (700, 520)
        assert image.text["Title"] == "job-1"
        assert image.text["Description"] == "loss vs step; tokens/s vs step"
        colours = image.convert("L").getextrema()
        assert colours[0] < 128 < colours[1]  # something dark was drawn on the white page


def test_a_log_without_metric_lines_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"no metric lines for train:loss.*metrics.log"):
        plot_metrics(read_metric_series(["no metrics here"]), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
