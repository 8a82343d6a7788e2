"""What `wait()` shows, the same for every backend: the job's log lines, its status, and its
training progress (step of total, loss, tokens/s, MFU, ETA) read from the metric lines.

It opens with one line that names the job, where its logs are and how to stop it; until the
first step, each phase of the start (installing requirements, launching, the ranks' rendezvous,
transform; meshtrain.contract.phases) is one line, then progress takes over. On a terminal a
live line (spinner, status, phase or progress, elapsed time) stays under the log, and each
host's lines have a colour of their own. Anywhere else (CI, files, notebooks without widgets)
the output is plain lines without control characters: the log as it is, each phase as
``[meshtrain] job-name: <phase>``, ``[meshtrain] job-name: first step after 0:00:12``, then a
progress line (``[meshtrain] job-name: step 40/100 · loss 2.31 · ETA 0:01:12``) at most every
`PLAIN_PROGRESS_SECONDS` and once at the end (each loss is in the log once: progress lines
are summaries). Both fold tracebacks and
C++/torchrun noise (log_folding.py): a failing job reads in a few lines; the job's log keeps
every line.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from meshtrain.log_folding import LogFolder
from meshtrain.progress import ProgressTracker, StartPhases, format_duration

HOST_STYLES = ("cyan", "green", "magenta", "yellow", "blue", "red")
PLAIN_PROGRESS_SECONDS = 30.0
_HOST_PREFIX = re.compile(r"^\[algo-(\d+)")


def host_index(line: str) -> int | None:
    """N of a ``[algo-N rank R]`` prefixed line (local, Docker and Kubernetes logs)."""
    match = _HOST_PREFIX.match(line)
    return int(match.group(1)) if match else None


def final_summary(tracker: ProgressTracker) -> str:
    """The progress once the job has ended (or stopped being watched): no ETA, and how long it
    ran (from when the client began to follow it: for fit(), the job's start)."""
    return dataclasses.replace(tracker.progress(), eta_seconds=None,
                               elapsed_seconds=tracker.elapsed_seconds()).summary()


def first_step_text(tracker: ProgressTracker) -> str:
    """The line that ends the start: when the first step came, counted from the start."""
    return f"first step after {format_duration(tracker.elapsed_seconds())}"


class JobDisplay(Protocol):
    """Where wait() sends what it has to show."""

    tracker: ProgressTracker

    def line(self, text: str) -> None: ...
    def log(self, text: str, host: int | None = None) -> None: ...
    def status(self, text: str) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """Plain lines: the log as it is, and a progress line now and then (never control codes)."""

    def __init__(self, job_name: str, tracker: ProgressTracker, *,
                 write: Callable[[str], object] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 every: float = PLAIN_PROGRESS_SECONDS,
                 folder: LogFolder | None = None, header: str | None = None) -> None:
        self.job_name, self.tracker, self.clock, self.every = job_name, tracker, clock, every
        self.folder = folder or LogFolder(job_name)
        self.phases = StartPhases()
        self._write = write or sys.stdout.write
        self._printed: str | None = None
        self._printed_at = clock()
        if header:
            self.line(header)

    def line(self, text: str) -> None:
        self._write(text + "\n")
        sys.stdout.flush()

    def log(self, text: str, host: int | None = None) -> None:
        phase = self.phases.feed(text)
        if phase is not None and self.tracker.step is None:
            self.line(f"[meshtrain] {self.job_name}: {phase}")
        for shown in self.folder.feed(text):
            self.line(shown)
        first = self.tracker.step is None
        if not self.tracker.feed(text) or self.tracker.step is None:
            return
        if first:  # the start is over: say when, then progress as usual
            self.line(f"[meshtrain] {self.job_name}: {first_step_text(self.tracker)}")
            self._printed_at = self.clock()
        elif self.clock() - self._printed_at >= self.every:
            self._print_progress()

    def status(self, text: str) -> None:
        """Plain output shows status through the lines the backend prints."""

    def _print_progress(self, final: bool = False) -> None:
        summary = final_summary(self.tracker) if final else self.tracker.progress().summary()
        if (final or self.tracker.step is not None) and summary != self._printed:
            self.line(f"[meshtrain] {self.job_name}: {summary}")
            self._printed = summary
        self._printed_at = self.clock()

    def close(self) -> None:
        for shown in self.folder.flush():
            self.line(shown)
        self._print_progress(final=True)


class LiveDisplay:
    """A terminal: the log in one colour per host, under a live status + progress line."""

    def __init__(self, console: Console, job_name: str, tracker: ProgressTracker,
                 header: str | None = None) -> None:
        self.console, self.job_name, self.tracker = console, job_name, tracker
        self.folder = LogFolder(job_name)
        self.phases = StartPhases()
        if header:
            self.line(header)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self._status = "starting"
        self.task = self.progress.add_task(self._description(), total=None)
        self.progress.start()

    def _description(self) -> str:
        text = f"{self.job_name}: {self._status}"
        if self.tracker.step is not None:
            text += f" · {self.tracker.progress().summary()}"
        elif self.phases.latest is not None:
            text += f" · {self.phases.latest}"
        return text

    def _refresh(self) -> None:
        self.progress.update(self.task, description=self._description())
        self.progress.refresh()  # now, not at the next tick: a poll loop may sleep long

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def log(self, text: str, host: int | None = None) -> None:
        style = HOST_STYLES[(host - 1) % len(HOST_STYLES)] if host else ""
        for shown in self.folder.feed(text):
            self.console.print(Text(shown, style=style), soft_wrap=True)
        if self.phases.feed(text) is not None or self.tracker.feed(text):
            self._refresh()

    def status(self, text: str) -> None:
        self._status = text
        self._refresh()

    def close(self) -> None:
        self.progress.stop()
        for shown in self.folder.flush():
            self.line(shown)
        self.line(f"[meshtrain] {self.job_name}: {final_summary(self.tracker)}")


def make_display(job_name: str, *, console: Console | None = None,
                 total_steps: int | None = None, header: str | None = None) -> JobDisplay:
    """A live display on a terminal, plain lines otherwise; `header` is its first line."""
    console = console or Console()
    tracker = ProgressTracker(total_steps)
    if console.is_terminal:
        return LiveDisplay(console, job_name, tracker, header)
    return PlainDisplay(job_name, tracker, header=header)
