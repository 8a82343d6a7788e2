"""`meshtrain logs JOB [--host H] [--rank R] [--follow] [--debug]`, `meshtrain plot JOB -o FILE`
and the readable `meshtrain describe JOB`."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.job import TERMINAL_STATUSES, TrainingJob, stop_reason
from meshtrain.job_layout import layout_rows

FOLLOW_POLL_SECONDS = 0.5
# Every line of a job's merged log starts with its source: "[algo-2] " (the host's bootstrap) or
# "[algo-2 rank 3] " (a rank, through torchrun's log-line prefix).
_SOURCE = re.compile(r"^\[(?P<host>[^\]\s]+)(?: rank (?P<rank>\d+))?\]")


def add_view_commands(sub: argparse._SubParsersAction, add_location: Callable[..., None],
                      job_command: Callable[[argparse.Namespace], int]) -> None:
    """Register logs (with filters) and plot; `job_command` finds the job and dispatches."""
    logs = sub.add_parser("logs", help="print a job's logs (filter by host and rank, follow)")
    logs.add_argument("job_name")
    logs.add_argument("--host", help="only lines of this host, e.g. algo-2")
    logs.add_argument("--rank", type=int, help="only lines of this global rank, e.g. 3")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing new lines until the job ends, then its outcome")
    logs.add_argument("--debug", action="store_true",
                      help="the output kept out of the job log: a fault-tolerant job's torchft "
                           "lines, per replica group")
    add_location(logs)
    logs.set_defaults(handler=job_command, action="logs")
    plot = sub.add_parser("plot", help="plot a job's loss and throughput to a PNG (needs "
                                       "matplotlib: pip install 'meshtrain[plot]')")
    plot.add_argument("job_name")
    plot.add_argument("-o", "--output", required=True, help="the PNG file to write")
    plot.add_argument("--metrics", default="train:loss,train:tokens_per_sec",
                      help="comma-separated metric names (default: %(default)s)")
    add_location(plot)
    plot.set_defaults(handler=job_command, action="plot")


def line_matches(line: str, host: str | None, rank: int | None) -> bool:
    """Whether a merged-log line comes from `host` and/or global `rank` (None: any)."""
    if host is None and rank is None:
        return True
    source = _SOURCE.match(line)
    if source is None:
        return False
    if host is not None and source.group("host") != host:
        return False
    return rank is None or source.group("rank") == str(rank)


def print_logs(job: TrainingJob, args: argparse.Namespace) -> None:
    """The job's log lines (filtered); with --follow, until it ends, then how it ended."""
    follow = getattr(args, "follow", False)
    lines = job.debug_log_lines() if getattr(args, "debug", False) else _lines(job, follow=follow)
    for line in lines:
        if line_matches(line, getattr(args, "host", None), getattr(args, "rank", None)):
            sys.stdout.write(line + "\n")
    if follow:
        sys.stdout.write(outcome_line(job.describe()) + "\n")
    sys.stdout.flush()


def outcome_line(description: dict[str, Any]) -> str:
    """``===== Job Failed: <reason's first line> =====``, as fit() ends its output."""
    reason = stop_reason(description).splitlines()
    return f"===== Job {description['TrainingJobStatus']}{reason[0] if reason else ''} ====="


def _lines(job: TrainingJob, *, follow: bool) -> Iterator[str]:
    if not follow:
        yield from job.log_lines()
        return
    seen = 0
    while True:
        ended = job.status in TERMINAL_STATUSES  # read before the log: nothing is missed
        lines = list(job.log_lines())
        yield from lines[seen:]
        seen = len(lines)
        if ended:
            return
        sys.stdout.flush()
        time.sleep(FOLLOW_POLL_SECONDS)


def plot_job(job: TrainingJob, args: argparse.Namespace) -> None:
    from meshtrain.metrics_plot import plot_metrics, read_metric_series

    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise ConfigError(f"--output {output}: meshtrain plot writes PNG files; name it *.png.")
    names = [name.strip() for name in args.metrics.split(",") if name.strip()]
    series = read_metric_series(job.log_lines())
    plot_metrics(series, output, names=names, title=job.job_name)
    print(f"wrote {output}")



def seconds(value: Any) -> float:
    """A time as epoch seconds (local jobs write floats, boto3 datetimes, Kubernetes text)."""
    if hasattr(value, "timestamp"):
        return value.timestamp()
    if isinstance(value, str):
        from datetime import datetime

        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value)


def duration_text(start: Any, end: Any) -> str:
    """``1h02m03s`` / ``2m05s``; "-" when a time is missing."""
    if start is None or end is None or seconds(end) < seconds(start):
        return "-"
    minutes, secs = divmod(int(seconds(end) - seconds(start)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def when_text(value: Any) -> str:
    """A local wall-clock time, or "-"."""
    if value is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds(value)))


def _status_text(description: dict[str, Any]) -> str:
    status, secondary = description["TrainingJobStatus"], description.get("SecondaryStatus")
    return f"{status} ({secondary})" if secondary and secondary != status else status


def describe_job(description: dict[str, Any]) -> None:
    """Print a job's description for people: what, how it ended and why, its layout (script,
    hosts x processes, mesh), when, where."""
    resources = description.get("ResourceConfig") or {}
    end = description.get("TrainingEndTime")
    layout = description.get("Layout")
    rows = [
        ("Job", description["TrainingJobName"]),
        ("Status", _status_text(description)),
        ("Reason", (description.get("FailureReason") or "").strip()),
        ("Instances", f"{resources.get('InstanceCount', '?')} x "
                      f"{resources.get('InstanceType', '?')}" if resources else ""),
        *(layout_rows(layout) if layout else []),
        ("Image", (description.get("AlgorithmSpecification") or {}).get("TrainingImage", "")),
        ("Created", when_text(description.get("CreationTime"))),
        ("Training", duration_text(description.get("TrainingStartTime"), end or time.time())
         + ("" if end else " so far")),
        ("Progress", (description.get("Progress") or {}).get("Summary", "")),
        ("Model", (description.get("ModelArtifacts") or {}).get("S3ModelArtifacts", "")),
    ]
    for label, value in rows:
        if value:
            lines = str(value).splitlines()
            print(f"{label + ':':<11}{lines[0]}")
            for more in lines[1:]:
                print(f"{'':<11}{more}")
    transitions = description.get("SecondaryStatusTransitions") or []
    if transitions:
        print("History:")
        for step in transitions:
            print(f"  {when_text(step.get('StartTime')):<19}  {step.get('Status', ''):<10}  "
                  f"{step.get('StatusMessage', '')}".rstrip())
    print(f"Logs:      meshtrain logs {description['TrainingJobName']} [--rank N] [-f]")
