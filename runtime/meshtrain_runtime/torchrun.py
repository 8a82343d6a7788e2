"""`python -m meshtrain_runtime.torchrun ...`: torchrun, with a stop that is not an error.

When a job is stopped, the host's torchrun agent gets SIGTERM, ends its workers, and then
raises ``SignalException`` out of ``main()``: Python prints a 30-line traceback into the job's
log, which reads like a crash. This entry point runs torchrun's own ``main`` unchanged and turns
that one exception into a one-line note and the conventional exit code (128 + signal number).
Every other error keeps its traceback.
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except SignalException as stop:
        number = int(stop.sigval)
        print(f"meshtrain: torchrun stopped by {signal.Signals(number).name}; its workers "
              "were ended (a stop, not an error)", file=sys.stderr, flush=True)
        sys.exit(128 + number)


if __name__ == "__main__":
    main()
