"""Ctrl-C as a user meets it: the tests that interrupt a client start it with SIGINT's default
disposition, as a terminal's shell starts a program.

A child inherits an ignored SIGINT from its parent, and Python then leaves it ignored (no
KeyboardInterrupt); an xdist worker may have inherited or been given one (a worker ran the
Ctrl-C tests with SIGINT ignored, and the interrupted clients never stopped their jobs).
"""

from __future__ import annotations

import signal


def default_sigint() -> None:
    """`preexec_fn` for a client the test will interrupt: SIGINT back to its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
