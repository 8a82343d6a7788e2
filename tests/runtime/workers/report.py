"""Worker side of `run_torchrun` (tests/runtime/conftest.py): record JSON results per rank.

A worker script calls ``report({...})``; each call appends one JSON line to
``$MESHTRAIN_TEST_RESULTS/rank-<RANK>.jsonl``, which the pytest side reads back in order.
Import it from a worker as ``from report import report`` (rank_entry puts the worker's folder
on sys.path).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RESULTS_ENV = "MESHTRAIN_TEST_RESULTS"


def report(record: dict[str, Any]) -> None:
    """Append `record` (JSON-serialisable) to this rank's results file."""
    directory = os.environ.get(RESULTS_ENV)
    if not directory:
        raise RuntimeError(f"{RESULTS_ENV} is not set: run this worker through run_torchrun().")
    rank = int(os.environ.get("RANK", "0"))
    with (Path(directory) / f"rank-{rank}.jsonl").open("a") as stream:
        stream.write(json.dumps({"rank": rank, **record}) + "\n")


def report_cases(cases: Iterable[tuple[str, Callable[[], dict[str, Any]]]]) -> None:
    """Run each (name, case) in turn; rank 0 reports its record, or its error and goes on
    (one failing case must not hide the others)."""
    import torch.distributed as dist

    for name, run in cases:
        try:
            record = {"case": name, **run()}
        except Exception as error:
            record = {"case": name,
                      "error": "".join(traceback.format_exception(error))[-4000:]}
        if dist.get_rank() == 0:
            report(record)
