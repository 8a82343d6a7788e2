"""The display every backend's wait() uses: plain lines off a terminal, a live line on one; the
job's first line, one line per phase of its start, the first step."""

from __future__ import annotations

import io

from rich.console import Console

from meshtrain.contract.metrics import format_metric_line, format_metrics_line
from meshtrain.contract.phases import Phase, format_phase_line, parse_phase_line
from meshtrain.display import LiveDisplay, PlainDisplay, host_index, make_display
from meshtrain.progress import ProgressTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def metric(name: str, value: float, step: int) -> str:
    return "[algo-1 rank 0] " + format_metric_line(name, value, step)


def test_plain_display_passes_the_log_and_adds_progress_lines_at_most_every_interval():
    clock, out = Clock(), io.StringIO()
    display = PlainDisplay("job-1", ProgressTracker(10, clock=clock), write=out.write,
                           clock=clock, every=30)
    display.log("[algo-2 rank 1] loading", host=2)
    display.log(metric("train:loss", 2.5, 1))
    clock.now = 10.0
    display.log(metric("train:loss", 2.0, 2))
    assert out.getvalue().splitlines() == ["[algo-2 rank 1] loading", metric("train:loss", 2.5, 1),
                                           "[meshtrain] job-1: first step after 0:00:00",
                                           metric("train:loss", 2.0, 2)]  # not due yet
    clock.now = 31.0
    display.log(metric("train:loss", 1.5, 3))
    assert out.getvalue().splitlines()[-1] == (
        "[meshtrain] job-1: step 3/10 · loss 1.5000 · ETA 0:01:49")  # 7 steps at 15.5 s each
    display.status("InProgress")  # plain output: status comes through the backend's lines
    display.close()  # the final line: the job has ended, so no ETA but how long it ran
    text = out.getvalue()
    assert text.splitlines()[-1] == "[meshtrain] job-1: step 3/10 · loss 1.5000 · ran 0:00:31"
    display.close()
    assert out.getvalue() == text  # the same summary is never printed twice in a row
    assert "\x1b" not in text


def test_plain_display_ends_with_the_progress_and_the_time_the_job_ran():
    clock, out = Clock(), io.StringIO()
    display = PlainDisplay("job-2", ProgressTracker(clock=clock), write=out.write, clock=clock)
    # one line of several metrics, as meshtrain_runtime.metrics.log() prints it
    step_line = "[algo-1 rank 0] " + format_metrics_line(
        {"train:loss": 0.5, "train:tokens_per_sec": 2048.0, "train:mfu": 0.25}, step=4)
    display.log(step_line)
    clock.now = 3725.0
    display.close()
    assert out.getvalue().splitlines()[0] == step_line  # the log line itself is passed through
    last = out.getvalue().splitlines()[-1]
    assert last == ("[meshtrain] job-2: step 4 · loss 0.5000 · 2,048 tokens/s · MFU 25.0% · "
                    "ran 1:02:05")
    silent, clock = io.StringIO(), Clock()
    quiet = PlainDisplay("job-3", ProgressTracker(clock=clock), write=silent.write, clock=clock)
    quiet.log("no metrics here")
    clock.now = 42.0
    quiet.close()  # issue 35: a job without metric lines still says how long it ran
    assert silent.getvalue() == "no metrics here\n[meshtrain] job-3: ran 0:00:42\n"


def test_live_display_draws_status_and_progress_on_a_terminal():
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160, color_system=None)
    display = make_display("live-job", console=console, total_steps=100)
    assert isinstance(display, LiveDisplay)
    display.status("InProgress")
    display.log(metric("train:loss", 2.25, 40), host=1)
    display.close()
    text = screen.getvalue()
    assert "live-job: InProgress · step 40/100 · loss 2.2500" in text
    assert "\x1b[" in text
    assert "[meshtrain] live-job: step 40/100 · loss 2.2500 · ran 0:00:0" in text


def test_make_display_is_plain_off_a_terminal():
    console = Console(file=io.StringIO(), force_terminal=False)
    assert isinstance(make_display("j", console=console), PlainDisplay)


def test_host_index_reads_the_log_prefix():
    assert host_index("[algo-12 rank 3] hi") == 12
    assert host_index("[algo-2] supervisor line") == 2
    assert host_index("plain line") is None


def test_plain_display_says_the_job_then_each_phase_once_until_the_first_step():
    clock, out = Clock(), io.StringIO()
    display = PlainDisplay("job-4", ProgressTracker(clock=clock), write=out.write, clock=clock,
                           header="[meshtrain] job job-4 · logs: ... · stop: ...")
    launch = format_phase_line(Phase.LAUNCH, "algo-1 starts torchrun: 2 processes")
    for line in (f"[algo-1] {launch}", "[algo-2] " + format_phase_line(Phase.LAUNCH, "algo-2 ..."),
                 "[algo-1 rank 0] " + format_phase_line(Phase.RENDEZVOUS, "4 ranks joined (gloo)"),
                 "[algo-1 rank 0] " + format_phase_line(Phase.TRANSFORM, "TinyLM on pp 1 x ...")):
        display.log(line)
    clock.now = 9.2
    display.log(metric("train:loss", 4.0, 0))
    display.log("[algo-1 rank 0] " + format_phase_line(Phase.TRANSFORM, "a second model"))
    assert out.getvalue().splitlines() == [
        "[meshtrain] job job-4 · logs: ... · stop: ...",
        "[meshtrain] job-4: algo-1 starts torchrun: 2 processes",  # the first host's, once
        "[meshtrain] job-4: 4 ranks joined (gloo)",
        "[meshtrain] job-4: TinyLM on pp 1 x ...",
        metric("train:loss", 4.0, 0),
        "[meshtrain] job-4: first step after 0:00:10",
    ]  # the raw phase lines stay in the job's log, and a phase after the first step is quiet


def test_live_display_shows_the_phase_until_the_first_step():
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=160, color_system=None)
    display = make_display("live-2", console=console, header="[meshtrain] job live-2 · ...")
    display.status("InProgress")
    display.log("[algo-1 rank 0] " + format_phase_line(Phase.RENDEZVOUS, "4 ranks joined"))
    assert "live-2: InProgress · 4 ranks joined" in screen.getvalue()
    display.log(metric("train:loss", 2.0, 0), host=1)
    display.close()
    text = screen.getvalue()
    assert text.index("[meshtrain] job live-2 · ...") < text.index("4 ranks joined")
    assert "live-2: InProgress · step 0 · loss 2.0000" in text
    assert "[meshtrain phase]" not in text


def test_phase_lines_round_trip_and_refuse_strangers():
    line = format_phase_line(Phase.TRANSFORM, "Llama on\npp 2")
    assert line == "[meshtrain phase] transform: Llama on pp 2"
    assert parse_phase_line(f"[algo-1 rank 0] {line}") == (Phase.TRANSFORM, "Llama on pp 2")
    assert parse_phase_line("[meshtrain phase] lunch: soup") is None
    assert parse_phase_line("step 3 loss 2.0") is None
