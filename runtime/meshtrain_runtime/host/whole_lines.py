"""torchrun's copy of each rank's output, one whole line at a time.

With ``--tee`` and a log-line prefix (how the bootstrap runs torchrun) torchrun's ``TailLog``
copies each rank's output file to its own stdout, one thread per rank, each line behind the
rank's prefix. It reads with ``readline()``, which returns a line caught half-written as it is:
the half is copied with the prefix and without its newline, the next rank's line lands right
after it, and the rest follows later under a second prefix (a job's log showed
``... step=57[algo-1 rank 0] ...``). `tail_whole_lines` keeps such a half until its newline
arrives (or the rank has ended), so every copied line is whole and no rank's text shares a line
with another's.

It replaces ``torch.distributed.elastic.multiprocessing.tail_log.tail_logfile``, a module
function ``TailLog.start`` looks up when it starts its threads. That is torch's internal code:
`install` checks the shape it relies on first and leaves torch's function in place when it
differs (tests/runtime/host/test_whole_lines.py pins it against the installed torch).
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from threading import Event
from typing import TextIO

_TORCH_PARAMETERS = ("header", "file", "dst", "finished", "interval_sec", "log_line_filter")


def tail_whole_lines(header: str, file: str, dst: TextIO, finished: Event, interval_sec: float,
                     log_line_filter: Callable[[str], bool] | None = None) -> None:
    """Copy `file` to `dst` as it grows, each whole line behind `header`, until `finished` is
    set and the file is read to its end (a last line without a newline gets one)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    with open(file, errors="replace") as source:
        pending = ""
        while True:
            chunk = source.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    _copy(header, pending, dst, log_line_filter)
                    pending = ""
            elif finished.is_set():  # the rank has ended: what it wrote last, then stop
                rest = pending + source.read()
                for line in rest.removesuffix("\n").split("\n") if rest else ():
                    _copy(header, line + "\n", dst, log_line_filter)
                return
            else:
                time.sleep(interval_sec)


def _copy(header: str, line: str, dst: TextIO,
          log_line_filter: Callable[[str], bool] | None) -> None:
    if log_line_filter is None or log_line_filter(line):
        dst.write(f"{header}{line}")  # one write: a line never shares a write with another


def install() -> bool:
    """Have torchrun's TailLog copy whole lines; False (torch's own left) when torch's code is
    not the shape this replaces."""
    from torch.distributed.elastic.multiprocessing import tail_log

    original = getattr(tail_log, "tail_logfile", None)
    start = getattr(getattr(tail_log, "TailLog", None), "start", None)
    if original is None or start is None or "tail_logfile" not in start.__code__.co_names:
        return False
    if tuple(inspect.signature(original).parameters) != _TORCH_PARAMETERS:
        return False
    tail_log.tail_logfile = tail_whole_lines
    return True
