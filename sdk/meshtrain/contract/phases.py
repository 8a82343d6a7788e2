"""The phase line: what a host or rank 0 prints as a job starts, and what the client reads back.

Until its first step a job is quiet for seconds (installing requirements, starting torchrun,
the ranks meeting, transform(model)). Each of those steps prints one line,
``[meshtrain phase] rendezvous: 4 ranks joined (gloo)``; the client's view of the job shows
one line per phase (the first host to reach it) and leaves the raw lines to the job's log.
One format, one module, both sides (the runtime prints with :func:`format_phase_line`, the
client reads with :func:`parse_phase_line`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import NamedTuple

PHASE_LINE_PREFIX = "[meshtrain phase]"


class Phase(StrEnum):
    """The phases of a job's start, in the order they happen."""

    REQUIREMENTS = "requirements"
    """A host installs source_dir's requirements.txt (only when there is one)."""
    LAUNCH = "launch"
    """A host starts its processes (torchrun, or the script itself without torch_distributed)."""
    RENDEZVOUS = "rendezvous"
    """Every rank has joined the process group (init(), printed by rank 0)."""
    TRANSFORM = "transform"
    """transform(model) applies the layout (printed by rank 0)."""


_LINE = re.compile(r"\[meshtrain phase\] (?P<phase>[a-z_]+): (?P<detail>.*?)\s*$")


class PhaseRecord(NamedTuple):
    phase: Phase
    detail: str


def format_phase_line(phase: Phase, detail: str) -> str:
    """``[meshtrain phase] <phase>: <detail>`` (one line: newlines in `detail` become spaces)."""
    return f"{PHASE_LINE_PREFIX} {Phase(phase).value}: {' '.join(detail.split())}"


def parse_phase_line(line: str) -> PhaseRecord | None:
    """The phase a log line announces (after any ``[algo-N rank R]`` prefix), else None."""
    if PHASE_LINE_PREFIX not in line:
        return None
    match = _LINE.search(line)
    if match is None or match.group("phase") not in Phase._value2member_map_:
        return None
    return PhaseRecord(Phase(match.group("phase")), match.group("detail"))
