"""A host's ranks start as forks of one process that has imported torch once.

Every rank of a job imports torch, torch.distributed, DTensor, FSDP, DCP, the runtime and often
transformers: 2-4 CPU-seconds each, before its first line of training. On a host without GPUs
torchrun starts the ranks with its ``forkserver`` start method instead (``--start-method
forkserver --run-path``, public torchrun options). Its fork server is a fork of the agent, taken
once the agent has imported torch and before torchrun starts any thread (`start`); it imports
what the ranks will import (`rank_preload`), and each rank is a fork of it, with those
imports done.

What a forked rank sees is what a rank of its own sees: torchrun's environment, the job's
environment, its own Python and numpy random states (`rank_entry` reseeds numpy; Python's
``random`` reseeds itself in a fork), the script run as ``__main__`` by `rank_entry`. What
differs, and why it is safe:

- The fork server must outlive a stop's SIGTERM (its ranks die with it, see lifeline.py, and
  they need the grace period to save): the agent starts it with SIGTERM blocked, which it keeps;
  each rank unblocks SIGTERM first thing.
- /proc shows the agent's command line for a forked rank, and the environment the agent was
  started with (the job's token and replica group, not RANK): every rank names itself
  ``mt-rank-<RANK>`` (/proc/PID/comm, `rank_entry`), which is how a job's ranks are found; the
  server is ``mt-fork-server``.
- The server listens on a Unix socket in a folder the bootstrap creates and removes
  (`server_folder`), so a killed agent leaves nothing behind.
- Hosts with GPUs keep one fresh process per rank: a library imported in the fork server may
  initialise CUDA, and CUDA does not survive a fork.

``MESHTRAIN_RANK_START=exec`` in a job's environment turns this off (one process per rank).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from meshtrain.contract.env import (
    MESHTRAIN_FORK_SERVER_DIR,
    MESHTRAIN_RANK_PRELOAD,
    MESHTRAIN_RANK_START,
)
from meshtrain_runtime.host import rank_preload
from meshtrain_runtime.host.import_noise import drop_log_lines
from meshtrain_runtime.host.lifeline import die_with_parent, name_process

FORKSERVER = "forkserver"
SERVER_PROCESS_NAME = "mt-fork-server"
SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
UNIX_SOCKET_PATH_MAX = 107  # Linux: sun_path holds 108 bytes with the final NUL
SOCKET_PATH_BELOW_BASE = len("/mt-fork-xxxxxxxx/pymp-xxxxxxxx/listener-xxxxxxxx")
def forks_ranks(num_gpus: int, environ: dict[str, str] | os._Environ) -> bool:
    """Whether this host's ranks start as forks of a fork server (module docstring)."""
    wanted = environ.get(MESHTRAIN_RANK_START, "fork")
    return wanted != "exec" and num_gpus == 0 and sys.platform.startswith("linux")


def start(torchrun_args: list[str]) -> None:
    """Start multiprocessing's fork server as a fork of this process (the torchrun agent, with
    torch imported), before any rank and any thread of torchrun's: it preloads what
    MESHTRAIN_RANK_PRELOAD lists and keeps SIGTERM blocked for good. The ranks' environment is
    the server's and torchrun's per-rank variables: what torchrun would set in the agent's own
    environment later is set now.

    The standard library execs its fork server as a new interpreter, through
    ``multiprocessing.util.spawnv_passfds``: only that call is replaced, by a fork that runs the
    same command in this interpreter (`_fork_server`), so the address, pipes and bookkeeping
    stay the library's. Where a Python version stops going through it, the library's own
    server starts (correct, only without preloads; tests/runtime/host/test_fork_server.py
    checks the server is a fork)."""
    from multiprocessing import forkserver, resource_tracker, util

    from torch.distributed.run import parse_args

    # torchrun's launcher sets it in its own environment, which exec'd ranks copy
    os.environ.setdefault(SIGNALS_TO_HANDLE, parse_args(torchrun_args).signals_to_handle)
    resource_tracker.ensure_running()  # exec'd as usual, before the replacement
    original = util.spawnv_passfds

    def spawn(path: str, args: list[str], passfds: tuple[int, ...]) -> int:
        code = args[args.index("-c") + 1] if "-c" in args else ""
        if "multiprocessing.forkserver" not in code:
            return original(path, args, passfds)
        return _fork_server(code, passfds)

    report_every_failed_rank()
    quiet_failure_logs()
    util.spawnv_passfds = spawn
    try:
        with _sigterm_blocked(), _socket_folder():
            forkserver.ensure_running()
    finally:
        util.spawnv_passfds = original


def report_every_failed_rank() -> bool:
    """Have torchrun report every forked rank that has failed when it notices a failure, as it
    does for ranks of their own. Its context for forked ranks names only the first dead process
    it finds, in rank order: a rank that was SIGKILLed (no traceback of its own; only the agent
    sees how it ended) went unreported whenever a peer it took down had a lower rank.
    Returns False, leaving torch's code as it is, when that code is not the shape this relies
    on (tests/runtime/host/test_fork_server.py pins it against the installed torch)."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    poll = getattr(getattr(api, "MultiprocessContext", None), "_poll", None)
    if poll is None or not {"_pc", "error_files"} <= set(poll.__code__.co_names):
        return False
    if getattr(poll, "reports_every_failed_rank", False):
        return True

    def _poll(self: Any) -> Any:
        processes = getattr(self._pc, "processes", None) or []
        ended = {rank: process.exitcode for rank, process in enumerate(processes)}  # before
        result = poll(self)  # its close() ends the others, which are then no failure of theirs
        for rank, code in ended.items():
            if result is not None and result.failures and code and rank not in result.failures:
                result.failures[rank] = ProcessFailure(rank, processes[rank].pid, code,
                                                       self.error_files[rank])
        return result

    _poll.reports_every_failed_rank = True  # type: ignore[attr-defined]
    api.MultiprocessContext._poll = _poll
    return True


def quiet_failure_logs() -> None:
    """The two log records torchrun's context for forked ranks adds to a failure, both said
    already: the failed rank's ``ProcessExitedException`` traceback (a traceback of torch's own
    code; agent_entry prints one line naming every failed rank, each rank's own traceback is in
    the log) and "Terminating process N via signal SIGTERM" for the ranks it ends then (ranks of
    their own are ended without it)."""
    drop_log_lines("torch.distributed.elastic.multiprocessing.api", re.compile(
        r"^failed \(exitcode: -?\d+\) local_rank: \d+ \(pid: \d+\) of fn: run_script_path "))
    drop_log_lines("torch.multiprocessing.spawn",
                   re.compile(r"^Terminating process \d+ via signal SIGTERM$"))


def _fork_server(code: str, passfds: tuple[int, ...]) -> int:
    """Fork; in the child, run the fork server's `code` after the preloads, as exec would have
    it: only `passfds` and standard streams open. Returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    try:
        _close_fds_except({0, 1, 2, *map(int, passfds)})
        _become_server()
        exec(code, {"__name__": "__mp_fork_server__"})
    except SystemExit:  # its end: the agent is gone
        pass
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(0)
    return 0  # not reached


def _become_server() -> None:
    from multiprocessing import forkserver

    die_with_parent()  # the agent's end ends it (and, with theirs, its ranks)
    name_process(SERVER_PROCESS_NAME)
    server = getattr(forkserver, "_forkserver", None)  # the library's one ForkServer
    if isinstance(getattr(server, "_lock", None), type(threading.Lock())):
        server._lock = threading.Lock()  # held by the agent's ensure_running, which forked
    before = set(os.environ)
    rank_preload.preload()
    for name in set(os.environ) - before:  # set by an import (inductor's default cache dir):
        del os.environ[name]  # a rank sets it itself if it imports that module


def _close_fds_except(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


@contextlib.contextmanager
def server_folder(environment: dict[str, str]) -> Iterator[None]:
    """For the host's torchrun run with `environment`: a folder of its own for the fork
    server's socket (MESHTRAIN_FORK_SERVER_DIR), removed when the run ends, also when its agent
    was killed and could not remove it itself. Nothing when the ranks are not forked."""
    if not environment.get(MESHTRAIN_RANK_PRELOAD):
        yield
        return
    folder = tempfile.mkdtemp(prefix="mt-fork-", dir=_socket_base())
    environment[MESHTRAIN_FORK_SERVER_DIR] = folder
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _socket_base() -> str:
    """The temporary folder, or /tmp when a socket path under it would be too long: a Unix
    socket's path has room for 107 bytes, and the server's is <base>/mt-fork-*/pymp-*/listener-*
    (as Python 3.13's own fork server falls back to /tmp)."""
    base = tempfile.gettempdir()
    return base if len(base) + SOCKET_PATH_BELOW_BASE <= UNIX_SOCKET_PATH_MAX else "/tmp"


@contextlib.contextmanager
def _socket_folder() -> Iterator[None]:
    """multiprocessing's temporary folder, where its server's socket goes, inside the
    bootstrap's MESHTRAIN_FORK_SERVER_DIR (or a short temporary folder without one)."""
    previous = tempfile.tempdir
    tempfile.tempdir = os.environ.get(MESHTRAIN_FORK_SERVER_DIR) or _socket_base()
    try:
        yield
    finally:
        tempfile.tempdir = previous


@contextlib.contextmanager
def _sigterm_blocked() -> Iterator[None]:
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
