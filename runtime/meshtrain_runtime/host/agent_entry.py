"""torchrun with four additions: it dies with its bootstrap, it records how ranks failed, a stop
is not reported as a crash, and on the first host its rendezvous store listens on the job's
interface only (store.py).

The bootstrap starts ``python -m meshtrain_runtime.host.agent_entry <torchrun arguments>``
instead of ``python -m torch.distributed.run``. Arguments and behaviour are torchrun's; in addition:

- when workers fail, each failure torchrun observed (rank, exit code, the signal that killed it,
  when) is written to ``<MESHTRAIN_RANK_ERROR_DIR>/agent-failures.json``: a rank killed by
  SIGKILL leaves no traceback of its own, so only its agent can say what happened to it;
- when the job is stopped, the agent gets SIGTERM, ends its workers and raises
  ``SignalException`` out of torchrun's ``main()``, whose 30-line traceback reads like a crash.
  That one exception becomes a one-line note and the conventional exit code (128 + signal);
- when workers fail, torchrun's ``ChildFailedError`` traceback and its failure banner (30-40
  lines per host, none of them the cause: the ranks' own tracebacks are in the log) become one
  line naming the failed ranks, and exit code 1;
- on a host without GPUs the ranks are forks of a fork server this agent starts first, with
  their imports done (``fork_server.py``);
- each rank's output is copied one whole line at a time (``whole_lines.py``): a line a rank is
  still writing never shares a line of the log with another rank's.
Every other error keeps its traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from meshtrain.contract.env import (
    MESHTRAIN_JOB_NAME,
    MESHTRAIN_RANK_ERROR_DIR,
    MESHTRAIN_RANK_PRELOAD,
)
from meshtrain_runtime.host import fork_server, whole_lines
from meshtrain_runtime.host.lifeline import die_with_parent
from meshtrain_runtime.host.store import serve_rendezvous_store

AGENT_FAILURES = "agent-failures.json"


def failures_of(error: Any) -> list[dict[str, Any]]:
    """torchelastic's ChildFailedError.failures as plain JSON-able records."""
    records = []
    for rank, failure in sorted(error.failures.items()):
        message = failure.message if isinstance(failure.message, str) else json.dumps(
            failure.message)
        records.append({"rank": int(rank), "local_rank": failure.local_rank, "pid": failure.pid,
                        "exitcode": failure.exitcode, "time": float(failure.timestamp),
                        "message": message})
    return records


def failed_ranks_line(records: list[dict[str, Any]]) -> str:
    """One line for torchrun's failure banner: which ranks failed and how."""
    parts = [f"rank {r['rank']} (exit code {r['exitcode']})" for r in records]
    job = os.environ.get(MESHTRAIN_JOB_NAME) or "JOB"
    return (f"{', '.join(parts) or 'a worker'} failed; each rank's own output is in the job "
            f"log (meshtrain logs {job} --rank N)")


def record_failures(records: list[dict[str, Any]], error_dir: str | None) -> None:
    if not error_dir:
        return
    try:
        path = Path(error_dir) / AGENT_FAILURES
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(records))
    except OSError as error:  # a full disk must not hide the failure itself
        print(f"meshtrain: could not record rank failures: {error}", file=sys.stderr)


def main() -> None:
    die_with_parent()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    whole_lines.install()
    if os.environ.get(MESHTRAIN_RANK_PRELOAD):  # ranks are forks: start their server first
        fork_server.start(sys.argv[1:])
    served = serve_rendezvous_store(sys.argv[1:])  # the store on the job's interface only
    try:
        torchrun_main(sys.argv[1:])
    except ChildFailedError as error:
        records = failures_of(error)
        record_failures(records, os.environ.get(MESHTRAIN_RANK_ERROR_DIR))
        print(f"meshtrain: torchrun: {failed_ranks_line(records)}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SignalException as stop:
        number = int(stop.sigval)
        print(f"meshtrain: torchrun stopped by {signal.Signals(number).name}; its workers "
              "were ended (a stop, not an error)", file=sys.stderr, flush=True)
        sys.exit(128 + number)
    finally:
        del served  # its server lives as long as torchrun


if __name__ == "__main__":
    main()
