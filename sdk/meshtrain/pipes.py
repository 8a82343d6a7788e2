"""Output to a pipe whose reader has gone (`python launch.py | head`, a `| tee` ended by Ctrl-C).

Writing there raises BrokenPipeError. While a client follows a job, that must neither end the
client (the job would run on unwatched) nor replace a Ctrl-C (whose handler prints before it
stops the job): what is written to a closed pipe is dropped instead, and the client goes on.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import sys
from collections.abc import Iterator
from typing import Any, TextIO


def _same_file(fd: int, identity: tuple[int, int]) -> bool:
    with contextlib.suppress(OSError):
        status = os.fstat(fd)
        return (status.st_dev, status.st_ino) == identity
    return False


def _reader_gone(fd: int) -> bool:
    """Whether `fd` is a pipe or socket whose reading end has closed (poll reports an error)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if not (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    return False


def send_closed_pipes_to_devnull(stream: TextIO | None = None) -> None:
    """Point the descriptor behind `stream`, and stdout/stderr when they are the same pipe
    (`2>&1 |`), at /dev/null, so later writes and the flush at exit succeed quietly. Without
    `stream`: whichever of stdout and stderr is a pipe whose reader has gone."""
    if stream is None:
        for standard in (sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                if _reader_gone(standard.fileno()):
                    send_closed_pipes_to_devnull(standard)
        return
    try:
        fd = stream.fileno()
        status = os.fstat(fd)
    except (AttributeError, OSError, ValueError):  # no descriptor (a notebook's stream)
        return
    identity = (status.st_dev, status.st_ino)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for target in sorted({fd, 1, 2}):
            if target == fd or _same_file(target, identity):
                os.dup2(devnull, target)
    finally:
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):  # what was buffered now goes to /dev/null
        stream.flush()


class _DropsWhenClosed:
    """A text stream that forwards to `stream` and drops what its closed pipe cannot take."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            send_closed_pipes_to_devnull(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            send_closed_pipes_to_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ... as the stream's
        return getattr(self._stream, name)


@contextlib.contextmanager
def drop_output_to_closed_pipes() -> Iterator[None]:
    """Within: writes to a stdout/stderr whose reader has gone are dropped, not raised."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None:
        sys.stdout = _DropsWhenClosed(sys.stdout)  # type: ignore[assignment]
    if sys.stderr is not None:
        sys.stderr = _DropsWhenClosed(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
