"""What `wait()` prints: status transitions as the SageMaker SDK prints them, log lines, and a
live progress line (spinner, status, elapsed time) when the output is a terminal."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any, Protocol

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from meshtrain.backends.sagemaker.logs import LogEvent, stream_order

HOST_STYLES = ("cyan", "green", "magenta", "yellow", "blue", "red")


def _utc_text(value: Any) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc)
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def secondary_status_lines(current: dict[str, Any], previous: dict[str, Any] | None) -> list[str]:
    """New secondary-status transitions, ``"<YYYY-mm-dd HH:MM:SS> <Status> - <StatusMessage>"``.

    As SDK ``utils.secondary_training_status_changed`` / ``secondary_training_status_message``:
    nothing if the last message did not change; otherwise the transitions added since
    `previous` (or the last one again when only its message changed), stamped with the job's
    LastModifiedTime in UTC.
    """
    transitions = current.get("SecondaryStatusTransitions") or []
    if not transitions:
        return []
    before = (previous or {}).get("SecondaryStatusTransitions") or []
    last_message = before[-1].get("StatusMessage", "") if before else ""
    if previous is not None and transitions[-1].get("StatusMessage", "") == last_message:
        return []
    shown = transitions[-1:] if len(transitions) == len(before) else transitions[len(before):]
    stamp = _utc_text(current.get("LastModifiedTime") or shown[-1].get("StartTime"))
    return [f"{stamp} {t['Status']} - {t.get('StatusMessage', '')}" for t in shown]


def status_summary(description: dict[str, Any]) -> str:
    """One line for the live display: job, status, secondary status and its message."""
    transitions = description.get("SecondaryStatusTransitions") or [{}]
    message = transitions[-1].get("StatusMessage", "")
    summary = (f"{description['TrainingJobName']}: {description['TrainingJobStatus']} / "
               f"{description.get('SecondaryStatus', '')}")
    return f"{summary} - {message}" if message else summary


class Display(Protocol):
    """Where wait() sends what it has to show."""

    def line(self, text: str) -> None: ...
    def log(self, event: LogEvent) -> None: ...
    def status(self, description: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class PlainDisplay:
    """Lines to stdout, exactly as the SageMaker SDK prints them (logs, files, CI)."""

    def line(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def log(self, event: LogEvent) -> None:
        self.line(event.message)

    def status(self, description: dict[str, Any]) -> None:
        """Plain output shows status through the transition lines only."""

    def close(self) -> None:
        sys.stdout.flush()


class LiveDisplay:
    """A terminal: the same lines, one colour per host, under a live spinner + elapsed time."""

    def __init__(self, console: Console, job_name: str) -> None:
        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.task = self.progress.add_task(f"{job_name}: starting", total=None)
        self.summary = f"{job_name}: starting"
        self.progress.start()

    def line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def log(self, event: LogEvent) -> None:
        index = stream_order(event.stream)[0] - 1
        style = HOST_STYLES[index % len(HOST_STYLES)] if index >= 0 else None
        self.console.print(Text(event.message, style=style or ""), soft_wrap=True)

    def status(self, description: dict[str, Any]) -> None:
        self.summary = status_summary(description)
        self.progress.update(self.task, description=self.summary)
        self.progress.refresh()

    def close(self) -> None:
        self.progress.stop()


def make_display(console: Console | None, job_name: str) -> Display:
    """A live display on a terminal, plain lines otherwise."""
    console = console or Console()
    if console.is_terminal:
        return LiveDisplay(console, job_name)
    return PlainDisplay()
