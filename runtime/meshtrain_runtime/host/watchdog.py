"""Hang diagnosis: `torch_distributed.hang_timeout` seconds without progress on a rank.

Progress is anything a training loop completes: a collective of torch.distributed's Python API,
a backward pass, an optimizer step (see progress_hooks.py; none needs torch.optim), or a call
to :func:`progress`. Before a rank's first progress (start-up: importing, the rendezvous,
building the model, loading data, the first collective and compile) it gets a separate, longer
allowance: ``MESHTRAIN_STARTUP_TIMEOUT`` seconds if the job's environment sets it, else
``max(600, 10 x hang_timeout)``. When a rank makes no progress for that long, its
watchdog thread dumps every thread's Python stack into the rank's log and failure record and
tells apart the two kinds of stuck rank:

- not inside torch.distributed / autograd: this rank is what the others wait for (a sleep, a
  dead data loader, an endless loop). It is the root cause: its record says so and it exits,
  which ends the job;
- inside a collective: it waits for a peer. Its record is marked as a consequence and it keeps
  waiting another `hang_timeout` seconds, so that the rank it waits for reports first; if no rank
  does (a true collective deadlock), it exits then.

Nothing here imports torch before the script does.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from meshtrain.contract.env import MESHTRAIN_RANK_ERROR_DIR, SM_CURRENT_HOST
from meshtrain.contract.failures import write_rank_record
from meshtrain_runtime.host.progress_hooks import install as install_progress_hooks

HANG_TIMEOUT_ENV = "MESHTRAIN_HANG_TIMEOUT"
STARTUP_TIMEOUT_ENV = "MESHTRAIN_STARTUP_TIMEOUT"
MIN_STARTUP_TIMEOUT = 600.0
STARTUP_FACTOR = 10
HANG_EXIT_CODE = 1
WAITING_IN_COLLECTIVE = "waiting in a collective for a peer"
"""Marks a consequence in the failure record (meshtrain.contract.failures.SECONDARY_ERROR)."""
_COLLECTIVE_FRAMES = (f"torch{os.sep}distributed{os.sep}", f"torch{os.sep}autograd{os.sep}",
                      f"torch{os.sep}nn{os.sep}parallel{os.sep}")


_RANK_WRAPPER = (os.path.join("meshtrain_runtime", "host", "rank_entry.py"), "run_entry_point")


def rank_frames(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """The frames above the rank wrapper's call of the script: what the script runs, without
    the launch below it (a forked rank's stack starts in torchrun's and multiprocessing's
    code). The whole stack when the wrapper is not on it."""
    frames = list(stack)
    starts = [i for i, frame in enumerate(frames)
              if frame.filename.endswith(_RANK_WRAPPER[0]) and frame.name == _RANK_WRAPPER[1]]
    return frames[starts[-1] + 1:] if starts else frames


def in_collective(stack: traceback.StackSummary) -> bool:
    """True if a frame the script runs is torch's distributed or autograd machinery."""
    return any(part in frame.filename for frame in rank_frames(stack)
               for part in _COLLECTIVE_FRAMES)


class HangWatchdog:
    """One rank's watchdog thread (start() it; call progress() on progress)."""

    def __init__(self, timeout: float, *, startup_timeout: float | None = None,
                 main_thread: threading.Thread | None = None) -> None:
        self.timeout = timeout
        self.startup_timeout = (startup_timeout if startup_timeout is not None
                                else default_startup_timeout(timeout))
        self.main = main_thread or threading.main_thread()
        self.started = time.monotonic()
        self.last: float | None = None  # None: still starting up
        self._hooked = False

    def progress(self) -> None:
        self.last = time.monotonic()

    def start(self) -> HangWatchdog:
        threading.Thread(target=self._watch, name="meshtrain-hang-watchdog", daemon=True).start()
        return self

    def _hook_optimizers(self) -> None:
        """Once the script has imported torch.optim, count every optimizer step as progress
        (a global hook; the module may still be half imported: then try at the next tick)."""
        module = sys.modules.get("torch.optim.optimizer")
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is not None and not self._hooked:
            register(lambda *_: self.progress())
            self._hooked = True

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 10))
            self._hook_optimizers()
            now = time.monotonic()
            if self.last is None and now - self.started >= self.startup_timeout:
                self.report(starting=True)
                return
            if self.last is not None and now - self.last >= self.timeout:
                self.report()
                return

    def report(self, *, starting: bool = False) -> None:
        """Dump the stacks, record the failure, and end (or wait for the root cause)."""
        frames = sys._current_frames()
        main_stack = traceback.extract_stack(frames[self.main.ident]) if (
            self.main.ident in frames) else traceback.StackSummary()
        waiting = in_collective(main_stack)
        rank = os.environ.get("RANK", "0")
        span = (f"no progress in the {self.startup_timeout:g} s start-up allowance (before its "
                "first collective, backward pass or optimizer step)" if starting
                else f"no progress for {self.timeout:g} s")
        if waiting:
            message = f"Hang: {span}, {WAITING_IN_COLLECTIVE} (see the rank that is not)"
        else:
            message = (f"Hang: {span} and not in a collective: the other ranks wait for this "
                       "one")
        detail = "".join(traceback.format_list(_user_frames(main_stack)))
        print(f"meshtrain: rank {rank}: {message}. Its stack:\n{detail}", file=sys.stderr,
              flush=True)
        for thread_id, frame in frames.items():
            if thread_id not in (self.main.ident, threading.get_ident()):
                print(f"-- thread {thread_id}:\n{''.join(traceback.format_stack(frame))}",
                      file=sys.stderr, flush=True)
        _record(rank, message, f"Stack of rank {rank} (most recent call last):\n{detail}")
        if waiting:  # let the rank this one waits for report first, even from its start-up
            wake = max(time.monotonic(), self.started + self.startup_timeout) + self.timeout
            time.sleep(max(0.0, wake - time.monotonic()))
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(HANG_EXIT_CODE)


def _user_frames(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """The stack without runpy's and this runtime's launcher frames: users see their code."""
    launcher = f"meshtrain_runtime{os.sep}host{os.sep}"
    return [frame for frame in rank_frames(stack)
            if "runpy" not in frame.filename and launcher not in frame.filename]


def _record(rank: str, message: str, detail: str) -> None:
    error_dir = os.environ.get(MESHTRAIN_RANK_ERROR_DIR)
    if not error_dir:
        return
    report = {"rank": int(rank), "host": os.environ.get(SM_CURRENT_HOST, ""),
              "message": message, "traceback": detail, "time": time.time()}
    try:
        write_rank_record(error_dir, report)
    except OSError as error:
        print(f"meshtrain: could not record the hang report: {error}", file=sys.stderr)


def default_startup_timeout(hang_timeout: float) -> float:
    """The start-up allowance when the job's environment does not set one."""
    return max(MIN_STARTUP_TIMEOUT, STARTUP_FACTOR * hang_timeout)


_watchdog: HangWatchdog | None = None


def start_from_env() -> HangWatchdog | None:
    """Start this rank's watchdog if the job set a hang timeout (rank_entry calls this), and
    count completed collectives and backward passes as its progress."""
    global _watchdog
    value = os.environ.get(HANG_TIMEOUT_ENV)
    if value and _watchdog is None:
        startup = os.environ.get(STARTUP_TIMEOUT_ENV)
        _watchdog = HangWatchdog(float(value),
                                 startup_timeout=float(startup) if startup else None).start()
        install_progress_hooks(_watchdog.progress)
    return _watchdog


def progress() -> None:
    """Tell the watchdog this rank made progress (optimizer steps already do)."""
    if _watchdog is not None:
        _watchdog.progress()
