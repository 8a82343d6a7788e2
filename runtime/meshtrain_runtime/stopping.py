"""Stop with a grace period: a SIGTERM becomes a stop request that every rank agrees on.

When a job is stopped (stop(), Ctrl-C in fit(), max_run, SIGTERM to a host), each rank gets
SIGTERM and ``torch_distributed.stop_grace_seconds`` (default 120) before SIGKILL. A script that
calls :func:`stop_requested` (every rank, at the same point of each step) sees True on every
rank at the same step, saves a checkpoint and exits::

    for step in range(start, steps):
        train_step()
        if meshtrain_runtime.stop_requested():
            meshtrain_runtime.save_checkpoint(None, model, optimizer, step=step)
            break

The agreement: SIGTERM reaches ranks at slightly different times, so the call all-reduces
(MAX) each rank's flag over the default process group; it is a collective, which is why every
rank must call it at the same points. Until a script has called it once, SIGTERM ends a rank at
once as before (a script that does not watch for stops is not kept waiting for the grace period).

Nothing here imports torch before the script does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_requested = False
_watching = False  # the script called stop_requested(): SIGTERM no longer ends the rank
_installed = False


def _on_sigterm(signum: int, _frame: object) -> None:
    global _requested
    _requested = True
    if not _watching:  # nobody watches for a stop: end as an unhandled SIGTERM does
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def install() -> bool:
    """Turn this process's SIGTERM into a stop request (main thread only; rank_entry calls it).
    Returns True when the handler is installed."""
    global _installed
    if _installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    return True


def local_stop_requested() -> bool:
    """This rank received SIGTERM (no collective)."""
    return _requested


def stop_requested() -> bool:
    """True on every rank once any rank was asked to stop; call it on every rank, at the same
    point (it is a collective when torch.distributed is initialised)."""
    global _watching
    _watching = True
    install()
    torch = sys.modules.get("torch")
    if torch is None or not (torch.distributed.is_available()
                             and torch.distributed.is_initialized()):
        return _requested
    dist = torch.distributed
    if dist.get_world_size() == 1:
        return _requested
    device = "cpu"
    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([1 if _requested else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def reset() -> None:
    """Forget a stop request and the script's watching (tests; a new run in one process)."""
    global _requested, _watching
    _requested = _watching = False
