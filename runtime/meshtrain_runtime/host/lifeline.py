"""Every process of a local job dies with its parent (Linux PR_SET_PDEATHSIG).

The chain is supervisor -> bootstrap -> torchrun agent -> ranks. Each link calls
`die_with_parent()` first thing in its own process (the bootstrap, the agent wrapper and the rank
wrapper are all meshtrain code), so a SIGKILLed supervisor takes the whole tree with it: the
kernel sends SIGKILL to each child as its parent disappears, level by level.

Why in the child and not in a `preexec_fn`: torchrun starts the ranks itself, and the supervisor
has log-reader threads while it spawns hosts (preexec_fn is unsafe with threads). Why SIGKILL:
an orphaned job has nobody left to record its status or pack its outputs, and a script that traps
SIGTERM must not survive its supervisor. PDEATHSIG fires when the parent *thread* that forked the
child exits: the supervisor, the bootstrap and torchrun's agent all spawn from their main
thread, which lives as long as the process.

Only processes carrying a job token (MESHTRAIN_JOB_TOKEN, set by the local backend) do this:
in a container or on SageMaker the bootstrap is the main process and has no such parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

from meshtrain.contract.env import MESHTRAIN_JOB_TOKEN

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15  # the calling thread's name: the process's, called from its main thread


def _carries_token(pid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MESHTRAIN_JOB_TOKEN}={token}".encode() in environ.split(b"\0")


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if it already has.

    Returns True when the lifeline is set (Linux, inside a local job), False otherwise.
    """
    token = os.environ.get(MESHTRAIN_JOB_TOKEN)
    if not token or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    # The parent may have died before prctl: then we were re-parented to a process outside the
    # job (init or a subreaper), which does not carry the token.
    if not _carries_token(os.getppid(), token):
        os._exit(128 + signal.SIGKILL)
    return True


def name_process(name: str) -> None:
    """Set this process's name (/proc/PID/comm, what ps and top show; Linux keeps 15 bytes)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
