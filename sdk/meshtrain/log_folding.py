"""What the live view of a job's log folds away, so that a failure reads in a few lines.

The job's log keeps every line (``meshtrain logs JOB [--rank N]`` prints it whole); the view
that ``wait()`` / ``fit()`` prints condenses it:

- a rank's Python traceback becomes its last line, the exception, with where the full text is:
  ``[algo-2 rank 2] ValueError: lr must be positive (traceback: meshtrain logs JOB --rank 2)``;
- the traceback of a rank that failed only because a peer did (gloo's "Connection closed by
  peer", a broken pipe, an NCCL abort: ``meshtrain.contract.failures.SECONDARY_ERROR``) is
  left out: the failure reason lists those ranks as consequences;
- C++ backtraces (``Exception raised from ...`` and ``frame #N: ...`` lines, e.g. a TCPStore
  ``recvValueWithTimeout`` trace when a peer exits first) and torchelastic's per-worker
  "closing signal" / "failed (exitcode ...)" log lines are left out;
- the hosts' and rank 0's phase lines (``[meshtrain phase] ...``) are left out: the view says
  each phase once in its own words (display.py).

Set ``MESHTRAIN_LOG_VIEW=full`` in the client's environment to see every line as it is.
"""

from __future__ import annotations

import os
import re

from meshtrain.contract.failures import SECONDARY_ERROR
from meshtrain.contract.phases import PHASE_LINE_PREFIX

LOG_VIEW_ENV = "MESHTRAIN_LOG_VIEW"
_PREFIX = re.compile(r"^(\[algo-\d+(?: rank (\d+))?\] ?)")
_CPP_TRACE = re.compile(r"^(frame #\d+: |Exception raised from )")
_ELASTIC_NOISE = re.compile(
    r"^[WEI]\d{4} [\d:.]+ \d+ torch/distributed/elastic/.*(closing signal|failed \(exitcode)"
)
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")


class LogFolder:
    """Feed it the log lines in order; it returns the lines to show for each."""

    def __init__(self, job_name: str, *, full: bool | None = None) -> None:
        self.job_name = job_name
        self.full = os.environ.get(LOG_VIEW_ENV) == "full" if full is None else full
        self._open: dict[str, list[str]] = {}  # prefix -> the traceback being read

    def feed(self, line: str) -> list[str]:
        """The lines to show now for `line` (none while a traceback is being read)."""
        if self.full:
            return [line]
        match = _PREFIX.match(line)
        prefix, rank = (match.group(1), match.group(2)) if match else ("", None)
        body = line[len(prefix):]
        if (_CPP_TRACE.match(body.lstrip()) or _ELASTIC_NOISE.match(body)
                or body.startswith(PHASE_LINE_PREFIX)):
            return []
        block = self._open.get(prefix)
        if body.startswith("Traceback (most recent call last):"):
            self._open.setdefault(prefix, []).append(body)
            return []
        if block is None:
            # a consequence printed without its traceback (no user frame left to show)
            return [] if _EXCEPTION.match(body) and SECONDARY_ERROR.search(body) else [line]
        if not body or body[0].isspace() or body.startswith(_CHAINING):
            block.append(body)
            return []
        del self._open[prefix]  # the exception line ends the traceback
        if SECONDARY_ERROR.search(body):
            return []
        where = f"meshtrain logs {self.job_name}" + (f" --rank {rank}" if rank else "")
        return [f"{line}  (traceback: {where})"]

    def flush(self) -> list[str]:
        """One line for each traceback the end of the log cut off (a rank killed mid-print)."""
        lines = [f"{prefix}(a traceback cut off: meshtrain logs {self.job_name}"
                 f"{' --rank ' + match.group(2) if match and match.group(2) else ''})"
                 for prefix in self._open for match in [_PREFIX.match(prefix)]]
        self._open.clear()
        return lines
