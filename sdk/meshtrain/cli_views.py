"""`meshtrain logs JOB [--host H] [--rank R] [--follow]` and `meshtrain plot JOB -o FILE`."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from meshtrain.contract.errors import ConfigError
from meshtrain.job import TERMINAL_STATUSES, TrainingJob

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
                      help="keep printing new lines until the job ends (local jobs)")
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
    for line in _lines(job, follow=getattr(args, "follow", False)):
        if line_matches(line, getattr(args, "host", None), getattr(args, "rank", None)):
            sys.stdout.write(line + "\n")
    sys.stdout.flush()


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

