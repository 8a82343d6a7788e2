"""The progress the client shows is what the job's metric lines say, paced by their arrival."""

from __future__ import annotations

import pytest

from meshtrain.contract.metrics import format_metric_line, format_metrics_line
from meshtrain.progress import (
    Progress,
    ProgressTracker,
    format_duration,
    progress_of_log,
    total_steps_from,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def line(name: str, value: float, step: int | None = None, host: str = "algo-1") -> str:
    return f"[{host} rank 0] " + format_metric_line(name, value, step)


def test_tracker_reads_step_loss_throughput_and_paces_the_eta():
    clock = FakeClock()
    tracker = ProgressTracker(total_steps=100, clock=clock)
    assert tracker.feed("[algo-1 rank 0] loading data") is False
    assert tracker.feed(line("train:loss", 3.5, step=10))
    clock.now += 20.0  # 10 steps in 20 s -> 2 s per step
    tracker.feed(line("train:loss", 2.25, step=20))
    tracker.feed(line("train:tokens_per_sec", 4096.0, step=20))
    tracker.feed(line("train:mfu", 0.4125, step=20))
    progress = tracker.progress()
    assert (progress.step, progress.total_steps, progress.loss) == (20, 100, 2.25)
    assert progress.tokens_per_sec == 4096.0 and progress.mfu == 0.4125
    assert progress.eta_seconds == pytest.approx(160.0)  # 80 steps left at 2 s each
    clock.now += 15.0  # time passes with no new step: the ETA counts down
    assert tracker.progress().eta_seconds == pytest.approx(145.0)


def test_one_line_of_several_metrics_moves_every_field():
    """What meshtrain_runtime.metrics.log() prints: one line per step with every value."""
    clock = FakeClock()
    tracker = ProgressTracker(clock=clock)
    first = {"train:loss": 3.0, "train:total_steps": 40.0, "train:cpu_rss_gib": 1.5}
    assert tracker.feed("[algo-1 rank 0] " + format_metrics_line(first, step=0))
    clock.now += 5.0
    values = {"train:loss": 2.5, "train:tokens_per_sec": 31250.0, "train:tflops": 1.25,
              "train:mfu": 0.375, "train:cpu_rss_gib": 1.5}
    assert tracker.feed("[algo-1 rank 0] " + format_metrics_line(values, step=10))
    progress = tracker.progress()
    assert (progress.step, progress.total_steps, progress.loss) == (10, 40, 2.5)
    assert (progress.tokens_per_sec, progress.mfu) == (31250.0, 0.375)
    assert progress.eta_seconds == pytest.approx(15.0)  # 30 steps left at 0.5 s each
    assert tracker.values["train:tflops"] == 1.25


def test_total_steps_metric_overrides_the_hyperparameter():
    tracker = ProgressTracker(total_steps=total_steps_from({"max_steps": "50"}))
    assert tracker.total_steps == 50
    tracker.feed(line("train:total_steps", 80.0, step=1))
    assert tracker.total_steps == 80


def test_no_eta_before_two_steps_or_without_a_total():
    clock = FakeClock()
    tracker = ProgressTracker(clock=clock)
    tracker.feed(line("train:loss", 1.0, step=1))
    clock.now += 1
    tracker.feed(line("train:loss", 0.9, step=2))
    assert tracker.progress().eta_seconds is None  # no total known
    tracker.total_steps = 4
    assert tracker.progress().eta_seconds == pytest.approx(2.0)


def test_lines_of_an_older_step_and_non_finite_values_do_not_move_progress():
    tracker = ProgressTracker(total_steps=10, clock=FakeClock())
    tracker.feed(line("train:loss", 1.0, step=5))
    tracker.feed(line("train:loss", 7.0, step=3, host="algo-2"))  # a late line of an older step
    assert tracker.step == 5
    tracker.feed("[algo-1 rank 0] [meshtrain metric] train:loss=nan step=6")
    progress = tracker.progress()
    assert progress.step == 6 and progress.loss == 7.0  # the last finite value is kept


@pytest.mark.parametrize("hyperparameters, expected", [
    ({"max_steps": 200}, 200), ({"total_steps": "30"}, 30), ({"max_steps": "0"}, None),
    ({"max_steps": "ten"}, None), ({"epochs": 3}, None), (None, None),
])
def test_total_steps_from_hyperparameters(hyperparameters, expected):
    assert total_steps_from(hyperparameters) == expected


def test_summary_line_is_plain_text():
    progress = Progress(step=40, total_steps=100, loss=2.31, tokens_per_sec=1234.4, mfu=0.312,
                        eta_seconds=72.2)
    text = progress.summary()
    assert text == "step 40/100 · loss 2.3100 · 1,234 tokens/s · MFU 31.2% · ETA 0:01:13"
    assert "\x1b" not in text
    assert Progress().summary() == "no step reported yet"
    assert Progress(step=3).summary() == "step 3"


def test_progress_of_a_log_paces_the_eta_by_training_time():
    lines = [line("train:loss", 2.0 - step / 100, step=step) for step in range(1, 26)]
    progress = progress_of_log(lines, {"max_steps": 100}, training_seconds=50.0)
    assert (progress.step, progress.loss) == (25, pytest.approx(1.75))
    assert progress.eta_seconds == pytest.approx(150.0)  # 75 steps left at 2 s per step
    assert progress_of_log(lines, {}).eta_seconds is None


@pytest.mark.parametrize("seconds, text", [(0, "0:00:00"), (0.2, "0:00:01"), (59, "0:00:59"),
                                           (3725, "1:02:05"), (-3, "0:00:00")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
