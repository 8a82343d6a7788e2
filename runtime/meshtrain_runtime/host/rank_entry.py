"""Run one rank's copy of the user's entry point and end the process cleanly.

torchrun starts ``python -m meshtrain_runtime.host.rank_entry <script.py> <args...>`` on every rank,
or, on a host without GPUs, runs this file in a fork of the host's fork server (``--run-path``,
see `meshtrain_runtime.host.fork_server`). The wrapper runs the script as ``__main__`` (like
``python script.py``), records a failing rank's traceback where the bootstrap finds it, and ends
the rank with barrier -> destroy_process_group -> flush -> ``os._exit``: gloo's worker threads can
otherwise abort a successful process at exit ("terminate called without an active exception"),
which torchrun would report as a failure. A forked rank that succeeded returns to torchrun's
process wrapper instead, which ends it the same way once it has reported the rank done.
In a local job the rank first ties its life to its parent (see `meshtrain_runtime.host.lifeline`).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import os
import runpy
import signal
import sys
import time
import traceback

from meshtrain.contract.env import (
    MESHTRAIN_RANK_ERROR_DIR,
    MESHTRAIN_SOURCE_DIR,
    RANK_PROCESS_NAME_PREFIX,
    SM_CURRENT_HOST,
)
from meshtrain.contract.failures import write_rank_record
from meshtrain.contract.paths import OptMLPaths
from meshtrain_runtime.host.lifeline import die_with_parent, name_process

USER_ERROR_EXIT_CODE = 1


def record_failure(error: BaseException, error_dir: str | None) -> None:
    """Write this rank's exception to `<error_dir>/rank-<RANK>.json` for the bootstrap."""
    if not error_dir:
        return
    rank = os.environ.get("RANK", "0")
    report = {
        "rank": int(rank),
        "host": os.environ.get(SM_CURRENT_HOST, ""),
        "message": f"{type(error).__name__}: {error}",
        "traceback": user_traceback(error),
        "time": time.time(),
    }
    try:
        write_rank_record(error_dir, report)
    except OSError as write_error:  # a full disk: the traceback on stderr is all that is left
        print(f"meshtrain: could not record this rank's failure in {error_dir}: {write_error}",
              file=sys.stderr)


def user_traceback(error: BaseException) -> str:
    """The traceback a user reads: their own frames, their files named where they are."""
    text = "".join(traceback.format_exception(type(error), error, _user_frames(error)))
    return in_source_dir(text)


def in_source_dir(text: str) -> str:
    """`text` with the job's copy of the code (/opt/ml/code) named as the user's source folder
    the backend gave (MESHTRAIN_SOURCE_DIR), in traceback frames (``File "..."``)."""
    source = os.environ.get(MESHTRAIN_SOURCE_DIR)
    if not source:
        return text
    code_dir = str(OptMLPaths.from_env().code_dir)
    return text.replace(f'File "{code_dir}{os.sep}', f'File "{source.rstrip(os.sep)}{os.sep}')


def _user_frames(error: BaseException):
    """The traceback without this wrapper's and runpy's frames: users see their own code."""
    tb = error.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb or error.__traceback__


def _exit_code(exit_request: SystemExit) -> int:
    code = exit_request.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return USER_ERROR_EXIT_CODE


def shutdown_distributed(success: bool) -> None:
    """Synchronise and tear down torch.distributed if the script left it initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if success:
            dist.barrier()
        dist.destroy_process_group()
    except Exception as error:  # teardown must not turn a finished run into a crash
        print(f"meshtrain: process group teardown failed: {error}", file=sys.stderr)


def run_exit_handlers() -> None:
    """Run the atexit handlers and flush stdio, as an interpreter's normal end would."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def end_process(code: int) -> None:
    """Run atexit handlers, flush stdio and leave without C++ static destructors."""
    try:
        run_exit_handlers()
    finally:
        os._exit(code)


def write_whole_lines() -> None:
    """Each line the script prints reaches the rank's output in one write: the hosts run ranks
    with PYTHONUNBUFFERED, under which print() writes a text and its newline apart, and
    torchrun's copy of the output (host/whole_lines.py) would otherwise wait on, or see, half
    a line. Text still goes out at every newline and every flush."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(line_buffering=True, write_through=False)


def run_entry_point(script: str, args: list[str]) -> int:
    """Run `script` as __main__ with `args`; return the process exit code."""
    write_whole_lines()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        from meshtrain_runtime.compat import install_for_rank
        from meshtrain_runtime.host.import_noise import quiet_torchao_import
        from meshtrain_runtime.host.watchdog import start_from_env
        from meshtrain_runtime.stopping import install as watch_for_stop

        quiet_torchao_import()  # transformers imports torchao: see host/import_noise.py
        watch_for_stop()  # SIGTERM -> meshtrain_runtime.stop_requested() (docs/local-jobs.md)
        start_from_env()  # torch_distributed.hang_timeout (docs/local-jobs.md)
        install_for_rank()  # `import torch.sagemaker` for SMP jobs (docs/smp-compat.md)
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exit_request:
        code = _exit_code(exit_request)
    except BaseException as error:
        sys.stderr.write(user_traceback(error))
        record_failure(error, os.environ.get(MESHTRAIN_RANK_ERROR_DIR))
        code = 130 if isinstance(error, KeyboardInterrupt) else USER_ERROR_EXIT_CODE
    if code == 0:
        finish_replica_group()
    shutdown_distributed(success=code == 0)
    return code


def finish_replica_group() -> None:
    """A fault-tolerant job: say this rank's replica group finished, while its Manager still
    heartbeats (meshtrain_runtime.fault.coordination says why); nothing without one."""
    fault = sys.modules.get("meshtrain_runtime.fault")  # loaded with the runtime's state
    if fault is not None:
        try:
            fault.finish()
        except Exception as error:  # the run succeeded: say it, do not fail it
            print(f"meshtrain: could not mark the replica group finished: {error}",
                  file=sys.stderr)


def name_rank() -> None:
    """Name this process ``mt-rank-<RANK>`` (what ps and top show): how the client tells a job's
    ranks from its other processes, a forked rank's command line being its agent's
    (host/fork_server.py)."""
    name_process(f"{RANK_PROCESS_NAME_PREFIX}{os.environ.get('RANK', '0')}")


def become_own_process() -> None:
    """In a rank forked from the host's fork server: take SIGTERM again (the server blocks it),
    go by the main process's name, and draw numpy's global random numbers apart from the other
    ranks, as a process of its own would (Python's ``random`` reseeds itself in a fork)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    multiprocessing.current_process().name = "MainProcess"  # what libraries check for
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def finish_forked() -> None:
    """A forked rank's clean end: the atexit handlers and flushed output, then back to torchrun's
    process wrapper, which reports the rank done (an exit here would read as no result), waits
    until every rank of the host is done and leaves without C++ static destructors
    (multiprocessing ends its children with os._exit).

    That wait ends only when torchrun reads every rank's result, which it stops doing once it
    ends the ranks (a stop, a failed peer): it sends SIGTERM then, and a rank that has finished
    leaves at once, as a rank of its own has already left; so does one that was sent SIGTERM
    before it finished (the stop it saved for)."""
    from meshtrain_runtime.stopping import local_stop_requested

    run_exit_handlers()
    signal.signal(signal.SIGTERM, _leave_finished)  # first: a later SIGTERM cannot be missed
    if local_stop_requested():
        _leave_finished()


def _leave_finished(*_signal: object) -> None:
    os._exit(0)


def main() -> None:
    die_with_parent()  # a rank never outlives its torchrun agent, fork server or bootstrap
    forked = multiprocessing.parent_process() is not None  # a fork of the host's fork server
    if forked:
        become_own_process()
    name_rank()
    if len(sys.argv) < 2:
        print("usage: python -m meshtrain_runtime.host.rank_entry SCRIPT [ARGS...]",
              file=sys.stderr)
        end_process(2)
    code = run_entry_point(sys.argv[1], sys.argv[2:])
    if forked and code == 0:
        finish_forked()
        return
    end_process(code)


if __name__ == "__main__":
    main()
