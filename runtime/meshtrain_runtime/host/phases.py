"""Say which phase of its start a job is in (meshtrain.contract.phases): one line each.

A host's bootstrap announces its own phases (requirements, launch); rank-level phases
(rendezvous, transform) are announced by global rank 0 only, so a job of many ranks still reads
one line per phase. Torch-free: the bootstrap imports it.
"""

from __future__ import annotations

import os
import sys

from meshtrain.contract.env import SM_CURRENT_HOST
from meshtrain.contract.phases import Phase, format_phase_line


def announce(phase: Phase, detail: str) -> None:
    """Print the phase line now (one write, flushed: it never shares a line with another)."""
    sys.stdout.write(format_phase_line(phase, detail) + "\n")
    sys.stdout.flush()


def announce_on_rank_zero(phase: Phase, detail: str) -> None:
    """The phase line on global rank 0 of a job (RANK unset: a single process, which is rank
    0); nothing outside a job (a script or test run by hand has no client to read it)."""
    if os.environ.get(SM_CURRENT_HOST) and os.environ.get("RANK", "0") == "0":
        announce(phase, detail)
